// Which deck keys a resumed run may change (train/resume.hpp) and the config differences
// it is built on (config::differences).
#include <gtest/gtest.h>

#include "config/deck.hpp"
#include "train/resume.hpp"

namespace dst::train {
namespace {

config::RunConfig base() {
  return config::load_deck_text("model:\n  preset: tiny\ntraining:\n  max_steps: 20\n", "t.yaml");
}

TEST(ConfigDifferences, NamesEveryChangedKeyWithBothValues) {
  config::RunConfig a = base();
  config::RunConfig b = a;
  EXPECT_TRUE(config::differences(a, b).empty());
  b.model.d_model = 128;
  b.training.optimizer.betas = {0.9, 0.99};
  b.logging.every_steps = 7;
  const auto d = config::differences(a, b);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].path, "model.d_model");  // document order
  EXPECT_EQ(d[0].from, "256");
  EXPECT_EQ(d[0].to, "128");
  EXPECT_EQ(d[1].path, "training.optimizer.betas");
  EXPECT_EQ(d[2].path, "logging.every_steps");
  EXPECT_EQ(d[2].to, "7");
}

TEST(ResumeDeck, AllowsRunLengthLoggingDataAndLayoutChanges) {
  const config::RunConfig saved = base();
  config::RunConfig now = saved;
  now.training.max_steps = 40;
  now.training.stop_at_step = 30;
  now.training.micro_batch_size = 4;
  now.data.train = "other/*.h5";
  now.logging.every_steps = 1;
  now.eval.every_steps = 5;
  now.checkpoint.every_steps = 10;
  now.parallel.bucket_mb = 1.0;
  now.debug.inject_exit_in_checkpoint = true;
  const auto allowed = check_resume_deck(saved, now, "ck/step-10.h5");
  EXPECT_EQ(allowed.size(), 9u);
}

TEST(ResumeDeck, RefusesModelSeedAndOptimizerChangesListingEach) {
  const config::RunConfig saved = base();
  config::RunConfig now = saved;
  now.model.d_model = 128;
  now.run.seed = 7;
  now.training.optimizer.lr = 1e-3;
  now.data.seq_len = 128;
  now.logging.every_steps = 3;  // allowed, not listed
  try {
    check_resume_deck(saved, now, "ck/step-10.h5");
    FAIL() << "expected a DeckError";
  } catch (const DeckError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("ck/step-10.h5"), std::string::npos) << m;
    EXPECT_NE(m.find("4 keys"), std::string::npos) << m;
    EXPECT_NE(m.find("model.d_model: 256 in the checkpoint, 128 in this deck"), std::string::npos)
        << m;
    EXPECT_NE(m.find("run.seed: 1234 in the checkpoint, 7 in this deck"), std::string::npos) << m;
    EXPECT_NE(m.find("training.optimizer.lr"), std::string::npos) << m;
    EXPECT_NE(m.find("data.seq_len"), std::string::npos) << m;
    EXPECT_EQ(m.find("logging.every_steps"), std::string::npos) << m;
  }
}

TEST(ResumeDeck, EveryResumableKeyIsASchemaKeyOrSection) {
  const auto keys = config::schema_keys();
  for (const std::string& k : resumable_keys()) {
    bool found = false;
    for (const auto& info : keys)
      found = found || (k.back() == '.' ? info.path.rfind(k, 0) == 0 : info.path == k);
    EXPECT_TRUE(found) << k << " names no deck key";
  }
}

}  // namespace
}  // namespace dst::train
