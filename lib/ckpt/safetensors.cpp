/// \file safetensors.cpp
/// Writing and reading safetensors files (the export format; see safetensors.hpp).
#include "ckpt/safetensors.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/bf16.hpp"
#include "core/error.hpp"

namespace dst::ckpt {

// The format is little-endian; we write the host's bytes as they are (C++17 has no
// std::endian: the compilers' predefined macro says it).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors: little-endian hosts only");

namespace {

struct FileCloser {
  void operator()(std::FILE* f) const {
    if (f) std::fclose(f);
  }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error("safetensors " + path + ": " + why);
}

std::uint64_t element_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

std::uint64_t numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (const auto d : shape)
    n *= static_cast<std::uint64_t>(d);
  return n;
}

void write_all(std::FILE* f, const void* data, std::size_t bytes, const std::string& path) {
  if (bytes != 0 && std::fwrite(data, 1, bytes, f) != bytes)
    fail(path, std::string("write failed: ") + std::strerror(errno));
}

}  // namespace

const char* safetensors_dtype_name(StDType d) {
  return d == StDType::bf16 ? "BF16" : "F32";
}

std::uint64_t write_safetensors(const std::string& path, const std::vector<StTensor>& tensors,
                                StDType dtype, const std::map<std::string, std::string>& metadata) {
  const std::uint64_t esize = dtype == StDType::bf16 ? 2 : 4;
  // The header: __metadata__ first, then the tensors in the order given, their bytes
  // back to back in the same order.
  nlohmann::ordered_json header;
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata)
    if (k != "format") meta[k] = v;
  header["__metadata__"] = meta;
  std::set<std::string> names;
  std::uint64_t offset = 0;
  for (const StTensor& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      fail(path, "invalid tensor name '" + t.name + "'");
    if (!names.insert(t.name).second) fail(path, "duplicate tensor name '" + t.name + "'");
    for (const auto d : t.shape)
      if (d < 0) fail(path, "tensor " + t.name + " has a negative dimension");
    const std::uint64_t bytes = numel(t.shape) * esize;
    if (bytes != 0 && t.data == nullptr) fail(path, "tensor " + t.name + " has no data");
    header[t.name] = {{"dtype", safetensors_dtype_name(dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Spaces (valid JSON whitespace) until the data starts on an 8-byte boundary.
  while ((8 + text.size()) % 8 != 0)
    text.push_back(' ');
  const std::uint64_t n = text.size();

  const std::string tmp = path + ".tmp";
  {
    File f(std::fopen(tmp.c_str(), "wb"));
    if (!f) fail(tmp, std::string("cannot create: ") + std::strerror(errno));
    unsigned char len[8];
    for (int i = 0; i < 8; ++i)
      len[i] = static_cast<unsigned char>(n >> (8 * i));
    write_all(f.get(), len, 8, tmp);
    write_all(f.get(), text.data(), text.size(), tmp);
    std::vector<bf16> chunk;
    for (const StTensor& t : tensors) {
      const std::uint64_t count = numel(t.shape);
      if (dtype == StDType::f32) {
        write_all(f.get(), t.data, count * sizeof(float), tmp);
        continue;
      }
      constexpr std::uint64_t kChunk = 1 << 20;  // elements converted at a time
      for (std::uint64_t i = 0; i < count; i += kChunk) {
        const std::uint64_t m = std::min(kChunk, count - i);
        chunk.resize(m);
        for (std::uint64_t j = 0; j < m; ++j)
          chunk[j] = bf16::from_float(t.data[i + j]);
        write_all(f.get(), chunk.data(), m * sizeof(bf16), tmp);
      }
    }
    if (std::fflush(f.get()) != 0 || ::fsync(::fileno(f.get())) != 0)
      fail(tmp, std::string("flush failed: ") + std::strerror(errno));
    if (std::fclose(f.release()) != 0)
      fail(tmp, std::string("close failed: ") + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail(path, std::string("cannot rename from .tmp: ") + std::strerror(errno));
  return 8 + n + offset;
}

StHeader read_safetensors_header(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  if (std::fseek(f.get(), 0, SEEK_END) != 0) fail(path, "cannot seek");
  const long size_l = std::ftell(f.get());
  if (size_l < 8) fail(path, "shorter than the 8-byte header length");
  const auto size = static_cast<std::uint64_t>(size_l);
  std::rewind(f.get());
  unsigned char len[8];
  if (std::fread(len, 1, 8, f.get()) != 8) fail(path, "cannot read the header length");
  StHeader h;
  for (int i = 0; i < 8; ++i)
    h.header_bytes |= static_cast<std::uint64_t>(len[i]) << (8 * i);
  if (h.header_bytes > size - 8 || h.header_bytes > (100u << 20))
    fail(path, "header length " + std::to_string(h.header_bytes) + " exceeds the file or 100 MB");
  std::string text(h.header_bytes, '\0');
  if (std::fread(text.data(), 1, text.size(), f.get()) != text.size())
    fail(path, "cannot read the header");
  if (text.empty() || text[0] != '{') fail(path, "the header does not start with '{'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(path, std::string("the header is not JSON: ") + e.what());
  }
  if (!j.is_object()) fail(path, "the header is not a JSON object");
  const std::uint64_t buffer = size - 8 - h.header_bytes;
  for (const auto& [key, v] : j.items()) {
    if (key == "__metadata__") {
      if (!v.is_object()) fail(path, "__metadata__ is not an object");
      for (const auto& [mk, mv] : v.items()) {
        if (!mv.is_string()) fail(path, "__metadata__." + mk + " is not a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    StEntry e;
    e.name = key;
    try {
      e.dtype = v.at("dtype").get<std::string>();
      e.shape = v.at("shape").get<std::vector<std::int64_t>>();
      const auto off = v.at("data_offsets").get<std::vector<std::uint64_t>>();
      if (off.size() != 2) fail(path, key + ": data_offsets needs 2 numbers");
      e.begin = off[0];
      e.end = off[1];
    } catch (const nlohmann::json::exception& x) {
      fail(path, key + ": " + x.what());
    }
    const std::uint64_t es = element_bytes(e.dtype);
    if (es == 0) fail(path, key + ": unknown dtype " + e.dtype);
    for (const auto d : e.shape)
      if (d < 0) fail(path, key + ": negative dimension");
    if (e.end < e.begin || e.end - e.begin != numel(e.shape) * es)
      fail(path, key + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                     "] do not match " + e.dtype + " x shape");
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const StEntry& a, const StEntry& b) { return a.begin < b.begin; });
  std::uint64_t at = 0;
  for (const StEntry& e : h.tensors) {
    if (e.begin != at)
      fail(path, e.name + ": starts at " + std::to_string(e.begin) + ", expected " +
                     std::to_string(at) + " (the buffer must have no holes or overlaps)");
    at = e.end;
  }
  if (at != buffer)
    fail(path, "the tensors cover " + std::to_string(at) + " bytes of a " + std::to_string(buffer) +
                   "-byte buffer");
  return h;
}

std::vector<float> read_safetensors_tensor(const std::string& path, const StHeader& header,
                                           const std::string& name) {
  const auto it = std::find_if(header.tensors.begin(), header.tensors.end(),
                               [&](const StEntry& e) { return e.name == name; });
  if (it == header.tensors.end()) fail(path, "no tensor " + name);
  if (it->dtype != "F32" && it->dtype != "BF16")
    fail(path, name + ": dtype " + it->dtype + " cannot be read as f32");
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) fail(path, std::string("cannot open: ") + std::strerror(errno));
  const std::uint64_t start = 8 + header.header_bytes + it->begin;
  if (start > static_cast<std::uint64_t>(std::numeric_limits<long>::max()) ||
      std::fseek(f.get(), static_cast<long>(start), SEEK_SET) != 0)
    fail(path, "cannot seek to " + name);
  const std::uint64_t count = numel(it->shape);
  std::vector<float> out(count);
  if (it->dtype == "F32") {
    if (std::fread(out.data(), sizeof(float), count, f.get()) != count) fail(path, "short read");
  } else {
    std::vector<bf16> raw(count);
    if (std::fread(raw.data(), sizeof(bf16), count, f.get()) != count) fail(path, "short read");
    for (std::uint64_t i = 0; i < count; ++i)
      out[i] = raw[i].to_float();
  }
  return out;
}

}  // namespace dst::ckpt
