#include "data/tokenizer/bpe_tokenizer.hpp"

#include <array>
#include <atomic>
#include <deque>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "core/error.hpp"
#include "data/tokenizer/byte_tokenizer.hpp"
#include "data/tokenizer/detail/bpe_merge.hpp"
#include "data/tokenizer/detail/regex.hpp"
#include "data/tokenizer/utf8.hpp"

namespace dst::data {

namespace {

using json = nlohmann::json;
using detail::Regex;
using detail::SplitBehavior;

/// The byte-level alphabet of GPT-2 (`bytes_to_unicode` in its encoder.py, reproduced by
/// `tokenizers`' ByteLevel): printable Latin-1 bytes stand for themselves, the other 68
/// bytes for U+0100.. in byte order, so every byte is one visible character.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<std::int16_t, 324> cp_to_byte{};  // code points up to U+0143; -1 if unused
  ByteLevelAlphabet() {
    cp_to_byte.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : next++;
      cp_to_byte[byte_to_cp[b]] = static_cast<std::int16_t>(b);
    }
  }
};
const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

void append_utf8(std::string& s, char32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// The bytes a byte-level token string stands for; nullopt if some character is not in
/// the byte-level alphabet (e.g. "<｜begin▁of▁sentence｜>", which only an added token
/// can produce). The string is valid UTF-8 (it came from the JSON parser).
std::optional<std::string> byte_level_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    char32_t cp;
    std::size_t len;
    if (b < 0x80) {
      cp = b, len = 1;
    } else if (b < 0xE0) {
      cp = b & 0x1F, len = 2;
    } else if (b < 0xF0) {
      cp = b & 0x0F, len = 3;
    } else {
      cp = b & 0x07, len = 4;
    }
    for (std::size_t k = 1; k < len && i + k < s.size(); ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    if (cp >= alphabet().cp_to_byte.size() || alphabet().cp_to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(alphabet().cp_to_byte[cp]);
    i += len;
  }
  return out;
}

/// Error messages name the file and the JSON path: "tokenizer file 'x.json': model.merges[3]:
/// ...".
class Where {
 public:
  explicit Where(std::string origin) : origin_(std::move(origin)) {}
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw Error("tokenizer file '" + origin_ + "': " + path + ": " + what);
  }
  const json& member(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) fail(path, "expected an object, got " + std::string(obj.type_name()));
    const auto it = obj.find(key);
    if (it == obj.end()) fail(join(path, key), "missing");
    return *it;
  }
  std::string string(const json& v, const std::string& path) const {
    if (!v.is_string()) fail(path, "expected a string, got " + std::string(v.type_name()));
    return v.get<std::string>();
  }
  bool boolean(const json& obj, const std::string& path, const char* key, bool dflt) const {
    const auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return dflt;
    if (!it->is_boolean())
      fail(join(path, key), "expected true or false, got " + std::string(it->type_name()));
    return it->get<bool>();
  }
  TokenId id(const json& v, const std::string& path) const {
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
        v.get<std::int64_t>() > std::numeric_limits<TokenId>::max())
      fail(path, "expected a token id (integer 0.." +
                     std::to_string(std::numeric_limits<TokenId>::max()) + "), got " + v.dump());
    return v.get<TokenId>();
  }
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
};

/// A pre-tokenizer step: an optional prefix space (ByteLevel) then an optional split.
struct Stage {
  std::unique_ptr<Regex> regex;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool prefix_space = false;
};

/// Byte trie of added-token contents, for leftmost-longest matching (what the
/// Aho-Corasick automaton of `tokenizers` finds with MatchKind::LeftmostLongest).
class AddedTrie {
 public:
  void insert(std::string_view s, TokenId id) {
    if (nodes_.empty()) nodes_.emplace_back();
    std::int32_t n = 0;
    for (const char c : s) {
      const std::int32_t next = child(n, static_cast<unsigned char>(c));
      if (next >= 0) {
        n = next;
        continue;
      }
      nodes_.emplace_back();
      nodes_[n].edges.emplace_back(static_cast<unsigned char>(c),
                                   static_cast<std::int32_t>(nodes_.size() - 1));
      if (n == 0) first_[static_cast<unsigned char>(c)] = true;
      n = static_cast<std::int32_t>(nodes_.size() - 1);
    }
    nodes_[n].id = id;
  }
  bool empty() const { return nodes_.size() <= 1; }
  /// Longest token starting at text[pos]: its length (0 if none) and id.
  std::size_t match(std::string_view text, std::size_t pos, TokenId& id) const {
    if (!first_[static_cast<unsigned char>(text[pos])]) return 0;
    std::size_t best = 0;
    std::int32_t n = 0;
    for (std::size_t k = pos; k < text.size(); ++k) {
      n = child(n, static_cast<unsigned char>(text[k]));
      if (n < 0) break;
      if (nodes_[n].id >= 0) best = k + 1 - pos, id = nodes_[n].id;
    }
    return best;
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, std::int32_t>> edges;
    TokenId id = -1;
  };
  std::int32_t child(std::int32_t n, unsigned char c) const {
    for (const auto& [b, to] : nodes_[n].edges)
      if (b == c) return to;
    return -1;
  }
  std::vector<Node> nodes_;
  std::array<bool, 256> first_{};
};

std::atomic<std::uint64_t> g_next_instance{1};

/// Word cache bound: ~130k pieces (about 10 MB per thread) covers the distinct words of
/// large corpora; beyond it the cache restarts rather than grows without limit.
constexpr std::size_t kCacheMaxEntries = std::size_t{1} << 17;
/// Longer pieces are rarely repeated; caching them would only evict useful entries.
constexpr std::size_t kCacheMaxPieceBytes = 128;
/// Ids may leave holes (the DeepSeek-V3 and DeepSeek-LLM 7B files have none), but the id
/// tables are sized by the largest id: a 20-byte edit naming id 2^31 - 1 would otherwise
/// allocate ~70 GB. Beyond the number of tokens the file defines, at most this many
/// unused ids are accepted (docs/fuzzing.md, finding 2).
constexpr std::size_t kMaxIdHoles = std::size_t{1} << 16;

/// A tokenizer.json nests about 6 levels deep. nlohmann_json parses and destroys values
/// without recursion, but dump() (quoted in error messages) and comparisons recurse: a
/// hostile `"decoder": [[[[...]]]]` 200k levels deep overflowed the stack while the error
/// was being written (found with fuzz_tokenizer_json's harness; docs/fuzzing.md). Deeper
/// documents are refused before parsing.
constexpr int kMaxJsonDepth = 64;

/// Where `text` first nests deeper than kMaxJsonDepth (brackets outside strings), or npos.
std::size_t too_deep(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("tokenizer file '" + path + "': cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error("tokenizer file '" + path + "': read error");
  return ss.str();
}

}  // namespace

struct BpeTokenizer::Impl {
  std::string origin;
  std::uint64_t instance = g_next_instance.fetch_add(1);
  std::vector<Stage> stages;
  detail::MergeTable merges;
  bool ignore_merges = false;
  std::array<TokenId, 256> byte_id{};
  std::unordered_map<std::string, TokenId> id_of_bytes;  // vocabulary entries, as bytes
  AddedTrie raw_added, normalized_added;                 // pass 1 / pass 2 of extraction
  std::unordered_map<std::string, TokenId> added_ids;
  std::vector<std::string> id_text;     // id -> bytes (decode)
  std::vector<std::uint8_t> id_kind;    // 0 none, 1 vocabulary, 2 added, 3 added special
  std::vector<TokenId> prefix, suffix;  // add_special
  std::optional<TokenId> bos, eos;

  struct Scratch {
    std::uint64_t owner = 0;
    detail::MatchScratch match;
    detail::MergeScratch merge;
    std::vector<std::string_view> pieces, next;
    std::deque<std::string> prefixed;  // pieces given a prefix space (stable addresses)
    std::unordered_map<std::string, std::pair<std::uint32_t, std::uint32_t>> cache;
    std::vector<TokenId> cache_ids;  // cache values: [offset, offset + count)
    std::string key;
    std::vector<TokenId> symbols;
  };

  /// This thread's scratch, reset when it last served another tokenizer.
  Scratch& scratch() const {
    thread_local Scratch s;
    if (s.owner != instance) {
      s.owner = instance;
      s.cache.clear();
      s.cache_ids.clear();
    }
    return s;
  }

  void pre_tokenize(std::string_view text, Scratch& s) const {
    s.pieces.clear();
    s.prefixed.clear();
    s.pieces.push_back(text);
    for (const Stage& st : stages) {
      s.next.clear();
      for (std::string_view p : s.pieces) {
        if (st.prefix_space && (p.empty() || p.front() != ' ')) {
          s.prefixed.push_back(" " + std::string(p));
          p = s.prefixed.back();
        }
        if (st.regex)
          detail::split_by_regex(p, *st.regex, st.behavior, st.invert, s.match, s.next);
        else if (!p.empty())
          s.next.push_back(p);
      }
      s.pieces.swap(s.next);
    }
  }

  void bpe(std::string_view piece, std::vector<TokenId>& out, Scratch& s) const {
    if (piece.size() == 1) {
      out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
      return;
    }
    const bool cacheable = piece.size() <= kCacheMaxPieceBytes;
    if (cacheable) {
      s.key.assign(piece);
      const auto it = s.cache.find(s.key);
      if (it != s.cache.end()) {
        const auto* ids = s.cache_ids.data() + it->second.first;
        out.insert(out.end(), ids, ids + it->second.second);
        return;
      }
    }
    s.symbols.clear();
    const auto whole = ignore_merges ? id_of_bytes.find(std::string(piece)) : id_of_bytes.end();
    if (whole != id_of_bytes.end()) {
      s.symbols.push_back(whole->second);
    } else {
      for (const char c : piece)
        s.symbols.push_back(byte_id[static_cast<unsigned char>(c)]);
      detail::bpe_merge(s.symbols, merges, s.merge);
    }
    out.insert(out.end(), s.symbols.begin(), s.symbols.end());
    if (cacheable) {
      if (s.cache.size() >= kCacheMaxEntries) {
        s.cache.clear();
        s.cache_ids.clear();
      }
      s.cache.emplace(s.key, std::make_pair(static_cast<std::uint32_t>(s.cache_ids.size()),
                                            static_cast<std::uint32_t>(s.symbols.size())));
      s.cache_ids.insert(s.cache_ids.end(), s.symbols.begin(), s.symbols.end());
    }
  }

  void encode_text(std::string_view text, std::vector<TokenId>& out, Scratch& s) const {
    if (text.empty()) return;
    pre_tokenize(text, s);
    for (const std::string_view p : s.pieces)
      bpe(p, out, s);
  }

  /// Splits `text` on the tokens of `trie`: their ids go to `out`, the text between
  /// them to `gap`.
  template <class Gap>
  static void extract(std::string_view text, const AddedTrie& trie, std::vector<TokenId>& out,
                      Gap&& gap) {
    if (trie.empty()) {
      gap(text);
      return;
    }
    std::size_t prev = 0;
    for (std::size_t i = 0; i < text.size();) {
      TokenId id = -1;
      const std::size_t len = trie.match(text, i, id);
      if (len == 0) {
        ++i;
        continue;
      }
      gap(text.substr(prev, i - prev));
      out.push_back(id);
      i += len;
      prev = i;
    }
    gap(text.substr(prev));
  }

  void load(const json& j, const Where& w, const json* config);
  void load_pre_tokenizer(const json& pt, const std::string& path, const Where& w,
                          bool& byte_level);
  void load_post_processor(const json& pp, const std::string& path, const Where& w);
  std::optional<TokenId> lookup(std::string_view text) const {
    if (const auto it = added_ids.find(std::string(text)); it != added_ids.end()) return it->second;
    if (const auto it = id_of_bytes.find(std::string(text)); it != id_of_bytes.end())
      return it->second;
    return std::nullopt;
  }
};

void BpeTokenizer::Impl::load_pre_tokenizer(const json& pt, const std::string& path, const Where& w,
                                            bool& byte_level) {
  const std::string type = w.string(w.member(pt, path, "type"), Where::join(path, "type"));
  if (type == "Sequence") {
    const json& list = w.member(pt, path, "pretokenizers");
    if (!list.is_array()) w.fail(Where::join(path, "pretokenizers"), "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string p = Where::join(path, "pretokenizers") + "[" + std::to_string(i) + "]";
      if (byte_level)
        w.fail(p,
               "comes after the ByteLevel pre-tokenizer; dstrain needs ByteLevel last "
               "(later splits would see the byte-level alphabet)");
      load_pre_tokenizer(list[i], p, w, byte_level);
    }
    return;
  }
  Stage st;
  if (type == "Split") {
    const json& pat = w.member(pt, path, "pattern");
    const std::string pp = Where::join(path, "pattern");
    std::string pcre;
    if (pat.is_object() && pat.contains("Regex")) {
      pcre = detail::onig_to_pcre2(w.string(pat["Regex"], pp + ".Regex"),
                                   "tokenizer file '" + w.origin() + "': " + pp);
    } else if (pat.is_object() && pat.contains("String")) {
      // A literal: quote it (\Q...\E cannot quote a literal "\E").
      for (const char c : w.string(pat["String"], pp + ".String")) {
        if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) pcre += '\\';
        pcre += c;
      }
    } else {
      w.fail(pp, "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string behavior = w.string(w.member(pt, path, "behavior"), path + ".behavior");
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    bool known = false;
    for (const auto& [name, b] : kBehaviors)
      if (behavior == name) st.behavior = b, known = true;
    if (!known) w.fail(path + ".behavior", "unknown split behavior \"" + behavior + "\"");
    st.invert = w.boolean(pt, path, "invert", false);
    st.regex = std::make_unique<Regex>(pcre, "tokenizer file '" + w.origin() + "': " + pp);
  } else if (type == "Digits") {
    // tokenizers splits on char::is_numeric (general category N): each digit alone, or
    // runs of them.
    const bool individual = w.boolean(pt, path, "individual_digits", false);
    st.regex = std::make_unique<Regex>("\\p{N}", "Digits pre-tokenizer");
    st.behavior = individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else if (type == "ByteLevel") {
    byte_level = true;
    st.prefix_space = w.boolean(pt, path, "add_prefix_space", true);
    if (w.boolean(pt, path, "use_regex", true)) {
      // tokenizers' ByteLevel regex (GPT-2's), split Isolated.
      st.regex = std::make_unique<Regex>(
          detail::onig_to_pcre2(
              R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
              "ByteLevel pre-tokenizer"),
          "ByteLevel pre-tokenizer");
    }
  } else {
    w.fail(Where::join(path, "type"),
           "unsupported pre-tokenizer \"" + type +
               "\" (supported: Sequence, Split, Digits, ByteLevel; see docs/tokenizers.md)");
  }
  stages.push_back(std::move(st));
}

void BpeTokenizer::Impl::load_post_processor(const json& pp, const std::string& path,
                                             const Where& w) {
  if (pp.is_null()) return;
  const std::string type = w.string(w.member(pp, path, "type"), Where::join(path, "type"));
  if (type == "ByteLevel") return;  // offsets only; no ids
  if (type == "Sequence") {
    const json& list = w.member(pp, path, "processors");
    if (!list.is_array()) w.fail(path + ".processors", "expected an array");
    for (std::size_t i = 0; i < list.size(); ++i)
      load_post_processor(list[i], path + ".processors[" + std::to_string(i) + "]", w);
    return;
  }
  if (type != "TemplateProcessing")
    w.fail(Where::join(path, "type"), "unsupported post-processor \"" + type +
                                          "\" (supported: ByteLevel, TemplateProcessing, "
                                          "Sequence)");
  const json& single = w.member(pp, path, "single");
  const json& specials = w.member(pp, path, "special_tokens");
  if (!single.is_array()) w.fail(path + ".single", "expected an array");
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string ip = path + ".single[" + std::to_string(i) + "]";
    const json& item = single[i];
    if (item.is_object() && item.contains("Sequence")) {
      seen_sequence = true;
      continue;
    }
    if (!item.is_object() || !item.contains("SpecialToken"))
      w.fail(ip, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    const std::string name =
        w.string(w.member(item["SpecialToken"], ip + ".SpecialToken", "id"), ip + ".id");
    if (!specials.is_object() || !specials.contains(name))
      w.fail(path + ".special_tokens", "has no entry \"" + name + "\" used by " + ip);
    const json& ids = w.member(specials[name], path + ".special_tokens." + name, "ids");
    if (!ids.is_array()) w.fail(path + ".special_tokens." + name + ".ids", "expected an array");
    for (const json& v : ids) {
      // The template's ids are emitted as they are: each must be a token (found by
      // fuzz_tokenizer_json: an id in a hole of the vocabulary made encode() return ids
      // that decode() refuses and that index no embedding row).
      const TokenId id = w.id(v, path + ".special_tokens." + name);
      if (static_cast<std::size_t>(id) >= id_kind.size() || id_kind[id] == 0)
        w.fail(path + ".special_tokens." + name + ".ids",
               "id " + std::to_string(id) + " is not a token of model.vocab or added_tokens");
      (seen_sequence ? suffix : prefix).push_back(id);
    }
  }
}

void BpeTokenizer::Impl::load(const json& j, const Where& w, const json* config) {
  if (!j.is_object()) w.fail("(top level)", "expected a JSON object");
  const auto& ab = alphabet();

  // Normalizer: none, or an empty Sequence (DeepSeek's). Anything else would change the
  // text before matching, which dstrain does not implement.
  if (const auto it = j.find("normalizer"); it != j.end() && !it->is_null()) {
    const std::string type = w.string(w.member(*it, "normalizer", "type"), "normalizer.type");
    const bool empty_seq = type == "Sequence" && it->contains("normalizers") &&
                           (*it)["normalizers"].is_array() && (*it)["normalizers"].empty();
    if (!empty_seq)
      w.fail("normalizer", "unsupported normalizer \"" + type +
                               "\" (only none or an empty Sequence; see docs/tokenizers.md)");
  }

  // Model: byte-level BPE.
  const json& model = w.member(j, "", "model");
  if (const auto it = model.find("type"); it != model.end() && *it != "BPE")
    w.fail("model.type", "unsupported model " + it->dump() + " (only BPE)");
  if (const auto it = model.find("dropout"); it != model.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() != 0.0)
      w.fail("model.dropout", "BPE dropout " + it->dump() + " is for training; must be null");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = model.find(key);
    if (it != model.end() && !it->is_null() && *it != "")
      w.fail(std::string("model.") + key, "unsupported (not byte-level BPE): " + it->dump());
  }
  if (w.boolean(model, "model", "byte_fallback", false))
    w.fail("model.byte_fallback", "unsupported: byte_fallback BPE is not byte-level BPE");
  ignore_merges = w.boolean(model, "model", "ignore_merges", false);

  const json& vocab = w.member(model, "model", "vocab");
  if (!vocab.is_object()) w.fail("model.vocab", "expected an object of token -> id");
  std::unordered_map<std::string, TokenId> vocab_ids;
  vocab_ids.reserve(vocab.size());
  TokenId max_id = -1;
  for (const auto& [tok, v] : vocab.items()) {
    const TokenId id = w.id(v, "model.vocab[\"" + tok + "\"]");
    vocab_ids.emplace(tok, id);
    max_id = std::max(max_id, id);
  }
  const json empty_array = json::array();
  const json* added = &empty_array;
  if (const auto it = j.find("added_tokens"); it != j.end() && !it->is_null()) added = &*it;
  if (!added->is_array()) w.fail("added_tokens", "expected an array");
  for (std::size_t i = 0; i < added->size(); ++i)
    max_id = std::max(max_id,
                      w.id(w.member((*added)[i], "added_tokens[" + std::to_string(i) + "]", "id"),
                           "added_tokens[" + std::to_string(i) + "].id"));
  if (max_id < 0) w.fail("model.vocab", "is empty");
  if (static_cast<std::size_t>(max_id) >= vocab_ids.size() + added->size() + kMaxIdHoles)
    w.fail("model.vocab", "ids reach " + std::to_string(max_id) + " but the file defines only " +
                              std::to_string(vocab_ids.size() + added->size()) +
                              " tokens: more than " + std::to_string(kMaxIdHoles) +
                              " unused ids is not a real vocabulary");
  id_text.assign(static_cast<std::size_t>(max_id) + 1, std::string());
  id_kind.assign(static_cast<std::size_t>(max_id) + 1, 0);
  id_of_bytes.reserve(vocab_ids.size());
  for (const auto& [tok, id] : vocab_ids) {
    // Entries outside the byte-level alphabet (special tokens listed in the vocabulary)
    // cannot come out of merges; they decode to their text, as tokenizers' ByteLevel
    // decoder does.
    const auto bytes = byte_level_decode(tok);
    id_text[id] = bytes ? *bytes : tok;
    id_kind[id] = 1;
    if (bytes) id_of_bytes.emplace(*bytes, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8(ch, ab.byte_to_cp[b]);
    const auto it = vocab_ids.find(ch);
    // C0, C1 and F5..FF never occur in well-formed UTF-8 (and input is repaired before
    // BPE), so a vocabulary may leave them out: DeepSeek-LLM 7B gives their characters
    // ("À", "ö", ...) to added tokens instead.
    const bool never_in_utf8 = b == 0xC0 || b == 0xC1 || b >= 0xF5;
    if (it == vocab_ids.end() && never_in_utf8) {
      byte_id[b] = -1;
      continue;
    }
    if (it == vocab_ids.end()) {
      std::ostringstream os;
      os << "lacks the byte-level token \"" << ch << "\" for byte 0x" << std::hex << b
         << ": not a byte-level BPE vocabulary";
      w.fail("model.vocab", os.str());
    }
    byte_id[b] = it->second;
  }

  const json& ml = w.member(model, "model", "merges");
  if (!ml.is_array()) w.fail("model.merges", "expected an array");
  merges.reserve(ml.size());
  for (std::size_t r = 0; r < ml.size(); ++r) {
    const std::string mp = "model.merges[" + std::to_string(r) + "]";
    std::string left, right;
    if (ml[r].is_string()) {  // "left right" (older files)
      const std::string s = ml[r].get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        w.fail(mp, "expected \"left right\" with exactly one space, got \"" + s + "\"");
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else if (ml[r].is_array() && ml[r].size() == 2 && ml[r][0].is_string() &&
               ml[r][1].is_string()) {  // ["left", "right"] (tokenizers >= 0.20)
      left = ml[r][0].get<std::string>(), right = ml[r][1].get<std::string>();
    } else {
      w.fail(mp, "expected \"left right\" or [\"left\", \"right\"], got " + ml[r].dump());
    }
    const auto l = vocab_ids.find(left), rt = vocab_ids.find(right),
               m = vocab_ids.find(left + right);
    if (l == vocab_ids.end()) w.fail(mp, "token \"" + left + "\" is not in model.vocab");
    if (rt == vocab_ids.end()) w.fail(mp, "token \"" + right + "\" is not in model.vocab");
    if (m == vocab_ids.end())
      w.fail(mp, "merged token \"" + left + right + "\" is not in model.vocab");
    merges.insert(l->second, rt->second, static_cast<std::uint32_t>(r), m->second);
  }

  // Added tokens: matched in the raw text (normalized=false) first, then in what is
  // left (normalized=true), as tokenizers' AddedVocabulary does.
  for (std::size_t i = 0; i < added->size(); ++i) {
    const std::string ap = "added_tokens[" + std::to_string(i) + "]";
    const json& t = (*added)[i];
    const TokenId id = w.id(w.member(t, ap, "id"), ap + ".id");
    const std::string content = w.string(w.member(t, ap, "content"), ap + ".content");
    if (content.empty()) w.fail(ap + ".content", "is empty");
    const bool special = w.boolean(t, ap, "special", false);
    const bool normalized = w.boolean(t, ap, "normalized", !special);
    for (const char* flag : {"lstrip", "rstrip", "single_word"})
      if (w.boolean(t, ap, flag, false))
        w.fail(Where::join(ap, flag),
               "unsupported: true (token \"" + content + "\"); see docs/tokenizers.md");
    (normalized ? normalized_added : raw_added).insert(content, id);
    added_ids[content] = id;
    id_text[id] = content;
    id_kind[id] = special ? 3 : 2;
  }

  bool byte_level = false;
  const json& pt = w.member(j, "", "pre_tokenizer");
  if (pt.is_null())
    w.fail("pre_tokenizer", "is null; byte-level BPE needs a ByteLevel pre-tokenizer");
  load_pre_tokenizer(pt, "pre_tokenizer", w, byte_level);
  if (!byte_level)
    w.fail("pre_tokenizer", "has no ByteLevel step: dstrain implements byte-level BPE only");

  const json& dec = w.member(j, "", "decoder");
  if (!dec.is_object() || dec.value("type", "") != "ByteLevel")
    w.fail("decoder", "expected a ByteLevel decoder, got " + dec.dump().substr(0, 80));

  if (const auto it = j.find("post_processor"); it != j.end())
    load_post_processor(*it, "post_processor", w);

  // tokenizer_config.json (transformers): markers, and which ones to add when the
  // post-processor adds none.
  if (config != nullptr && config->is_object()) {
    const auto token_of = [&](const char* key) -> std::optional<TokenId> {
      const auto it = config->find(key);
      if (it == config->end() || it->is_null()) return std::nullopt;
      const json& c = it->is_object() ? it->value("content", json()) : *it;
      if (!c.is_string()) return std::nullopt;
      const auto id = lookup(c.get<std::string>());
      if (!id)
        throw Error("tokenizer_config.json next to '" + w.origin() + "': " + key + " \"" +
                    c.get<std::string>() + "\" is not a token of the tokenizer");
      return id;
    };
    bos = token_of("bos_token");
    eos = token_of("eos_token");
    if (prefix.empty() && suffix.empty()) {
      if (bos && config->value("add_bos_token", false)) prefix.push_back(*bos);
      if (eos && config->value("add_eos_token", false)) suffix.push_back(*eos);
    }
  }
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_json(std::string_view text,
                                                      const std::string& origin,
                                                      std::string_view config_text) {
  const Where w(origin);
  if (const std::size_t at = too_deep(text); at != std::string_view::npos)
    throw Error("tokenizer file '" + origin + "': nests deeper than " +
                std::to_string(kMaxJsonDepth) + " levels at byte offset " + std::to_string(at));
  if (const std::size_t at = too_deep(config_text); at != std::string_view::npos)
    throw Error("tokenizer_config.json next to '" + origin + "': nests deeper than " +
                std::to_string(kMaxJsonDepth) + " levels at byte offset " + std::to_string(at));
  json j, config;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw Error("tokenizer file '" + origin + "': not valid JSON: " + e.what());
  }
  if (!config_text.empty()) {
    try {
      config = json::parse(config_text.begin(), config_text.end());
    } catch (const json::exception& e) {
      throw Error("tokenizer_config.json next to '" + origin + "': not valid JSON: " + e.what());
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  try {
    impl->load(j, w, config_text.empty() ? nullptr : &config);
  } catch (const json::exception& e) {  // a type the checks above did not foresee
    throw Error("tokenizer file '" + origin + "': unexpected content: " + e.what());
  }
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

std::unique_ptr<BpeTokenizer> BpeTokenizer::from_file(const std::string& path) {
  const std::string text = read_file(path);
  const auto slash = path.find_last_of('/');
  const std::string config_path =
      (slash == std::string::npos ? std::string() : path.substr(0, slash + 1)) +
      "tokenizer_config.json";
  std::string config;
  if (std::ifstream probe(config_path); probe.good()) config = read_file(config_path);
  return from_json(text, path, config);
}

void BpeTokenizer::encode_into(std::string_view text, std::vector<TokenId>& out,
                               bool add_special) const {
  const Impl& im = *impl_;
  std::string repaired;
  if (find_invalid_utf8(text) != std::string_view::npos) {
    repaired = replace_invalid_utf8(text);
    text = repaired;
  }
  Impl::Scratch& s = im.scratch();
  out.reserve(out.size() + text.size() / 3);
  if (add_special) out.insert(out.end(), im.prefix.begin(), im.prefix.end());
  Impl::extract(text, im.raw_added, out, [&](std::string_view gap) {
    Impl::extract(gap, im.normalized_added, out,
                  [&](std::string_view g) { im.encode_text(g, out, s); });
  });
  if (add_special) out.insert(out.end(), im.suffix.begin(), im.suffix.end());
}

std::string BpeTokenizer::decode(const TokenId* ids, std::size_t n, bool skip_special) const {
  const Impl& im = *impl_;
  std::string out;
  out.reserve(n * 4);
  for (std::size_t i = 0; i < n; ++i) {
    const TokenId id = ids[i];
    DST_REQUIRE(id >= 0 && static_cast<std::size_t>(id) < im.id_kind.size() && im.id_kind[id] != 0,
                "tokenizer '" << im.origin << "': cannot decode id " << id << " at position " << i
                              << " (no such token)");
    if (skip_special && im.id_kind[id] == 3) continue;
    out += im.id_text[id];
  }
  return out;
}

TokenId BpeTokenizer::vocab_size() const {
  return static_cast<TokenId>(impl_->id_kind.size());
}
std::optional<TokenId> BpeTokenizer::bos_id() const {
  return impl_->bos;
}
std::optional<TokenId> BpeTokenizer::eos_id() const {
  return impl_->eos;
}
bool BpeTokenizer::is_special(TokenId id) const {
  return id >= 0 && static_cast<std::size_t>(id) < impl_->id_kind.size() && impl_->id_kind[id] == 3;
}
std::string BpeTokenizer::describe() const {
  return impl_->origin;
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
  Impl::Scratch& s = impl_->scratch();
  impl_->pre_tokenize(text, s);
  return {s.pieces.begin(), s.pieces.end()};
}

std::optional<TokenId> BpeTokenizer::token_id(std::string_view text) const {
  return impl_->lookup(text);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_path) {
  if (name_or_path == "byte") return make_byte_tokenizer();
  return BpeTokenizer::from_file(name_or_path);
}

}  // namespace dst::data
