#include "config/run_config.hpp"

#include "config/schema.hpp"

namespace dst::config {

namespace {

// Compares the same field of two sections, for every field the schema lists.
struct EqualVisitor {
  bool equal = true;
  void section(const char*, const char*) {}
  template <class T>
  void field(const char*, const detail::Spec&, const T& a, const T& b) {
    equal = equal && a == b;
  }
};

}  // namespace

ResumeSetting ResumeSetting::parse(std::string_view text) {
  ResumeSetting r;
  if (text == "auto") {
    r.kind = Kind::automatic;
  } else if (text == "none") {
    r.kind = Kind::none;
  } else {
    r.kind = Kind::path;
    r.path = std::string(text);
  }
  return r;
}

std::string ResumeSetting::text() const {
  switch (kind) {
    case Kind::automatic:
      return "auto";
    case Kind::none:
      return "none";
    case Kind::path:
      break;
  }
  return path;
}

bool operator==(const ResumeSetting& a, const ResumeSetting& b) {
  return a.kind == b.kind && a.path == b.path;
}

bool operator==(const RunSection& a, const RunSection& b) {
  EqualVisitor v;
  detail::visit_run(v, a, b);
  return v.equal;
}
bool operator==(const ModelSection& a, const ModelSection& b) {
  EqualVisitor v;
  detail::visit_model(v, a, b);
  return v.equal;
}
bool operator==(const DataSection& a, const DataSection& b) {
  EqualVisitor v;
  detail::visit_data(v, a, b);
  return v.equal;
}
bool operator==(const OptimizerSection& a, const OptimizerSection& b) {
  EqualVisitor v;
  detail::visit_optimizer(v, a, b);
  return v.equal;
}
bool operator==(const ScheduleSection& a, const ScheduleSection& b) {
  EqualVisitor v;
  detail::visit_schedule(v, a, b);
  return v.equal;
}
bool operator==(const TrainingSection& a, const TrainingSection& b) {
  EqualVisitor v;
  detail::visit_training(v, a, b);
  return v.equal;
}
bool operator==(const ParallelSection& a, const ParallelSection& b) {
  EqualVisitor v;
  detail::visit_parallel(v, a, b);
  return v.equal;
}
bool operator==(const KernelsSection& a, const KernelsSection& b) {
  EqualVisitor v;
  detail::visit_kernels(v, a, b);
  return v.equal;
}
bool operator==(const CheckpointSection& a, const CheckpointSection& b) {
  EqualVisitor v;
  detail::visit_checkpoint(v, a, b);
  return v.equal;
}
bool operator==(const LoggingSection& a, const LoggingSection& b) {
  EqualVisitor v;
  detail::visit_logging(v, a, b);
  return v.equal;
}
bool operator==(const EvalSection& a, const EvalSection& b) {
  EqualVisitor v;
  detail::visit_eval(v, a, b);
  return v.equal;
}
bool operator==(const DebugSection& a, const DebugSection& b) {
  EqualVisitor v;
  detail::visit_debug(v, a, b);
  return v.equal;
}
bool operator==(const RunConfig& a, const RunConfig& b) {
  EqualVisitor v;
  detail::visit_schema(v, a, b);
  return v.equal;
}

bool operator==(const Layout& a, const Layout& b) {
  return a.world_size == b.world_size && a.data == b.data && a.tensor == b.tensor &&
         a.pipeline == b.pipeline && a.expert == b.expert && a.kv_replicas == b.kv_replicas &&
         a.grad_accum_steps == b.grad_accum_steps && a.global_batch_size == b.global_batch_size;
}

}  // namespace dst::config
