// Unit tests of the tokenizers: byte-level, UTF-8 repair, the Oniguruma->PCRE2 pattern
// translation, split behaviours, the two BPE merge algorithms, BPE loading and its
// errors. Expected ids and pieces come from Hugging Face tokenizers 0.23.3 (the
// reference; the full parity test is tests/oracle/tokenizer_parity.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "data/byte_vocab.hpp"
#include "data/tokenizer/bpe_tokenizer.hpp"
#include "data/tokenizer/byte_tokenizer.hpp"
#include "data/tokenizer/detail/bpe_merge.hpp"
#include "data/tokenizer/detail/regex.hpp"
#include "data/tokenizer/utf8.hpp"
#include "error_of.hpp"

namespace {

using dst::data::BpeTokenizer;
using dst::data::TokenId;
namespace detail = dst::data::detail;

const std::string kData = DSTRAIN_TOKENIZER_TEST_DATA;  // tests/data/tokenizer
const std::string kTiny = kData + "/tiny-bpe.json";

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

using dst::test::error_of;

// ---- byte-level ----

TEST(ByteTokenizer, BytesAreIdsAndInvalidUtf8RoundTrips) {
  const auto tok = dst::data::make_byte_tokenizer();
  const std::string text("a\xFF\x00\xC3\xA9<|eos|>", 10);
  const auto ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'a');
  EXPECT_EQ(ids[1], 0xFF);
  EXPECT_EQ(ids[2], 0);
  // A special token's name in the text stays bytes: text cannot inject control tokens.
  EXPECT_EQ(ids[5], '<');
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_EQ(tok->vocab_size(), dst::data::kByteVocabSize);
}

TEST(ByteTokenizer, AddSpecialWrapsOneDocument) {
  const auto tok = dst::data::make_byte_tokenizer();
  const std::vector<TokenId> want{dst::data::kByteBos, 'h', 'i', dst::data::kByteEos};
  EXPECT_EQ(tok->encode("hi", true), want);
  EXPECT_EQ(tok->decode(want), "<|bos|>hi<|eos|>");
  EXPECT_EQ(tok->decode(want, /*skip_special=*/true), "hi");
  EXPECT_TRUE(tok->is_special(dst::data::kBytePad));
  EXPECT_FALSE(tok->is_special(255));
  EXPECT_EQ(tok->bos_id(), dst::data::kByteBos);
  EXPECT_EQ(tok->eos_id(), dst::data::kByteEos);
}

TEST(ByteTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const auto tok = dst::data::make_byte_tokenizer();
  const std::string msg = error_of([&] { tok->decode(std::vector<TokenId>{65, 260}); });
  EXPECT_NE(msg.find("id 260 at position 1"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { tok->decode(std::vector<TokenId>{-1}); }), "");
}

// ---- UTF-8 ----

TEST(Utf8, FindsTheFirstIllFormedByte) {
  using dst::data::find_invalid_utf8;
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("\xE4\xBD\xA0\xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("ab\xC0\xAF"), 2u);         // overlong '/'
  EXPECT_EQ(find_invalid_utf8("\xED\xA0\x80"), 0u);       // surrogate U+D800
  EXPECT_EQ(find_invalid_utf8("x\xF4\x90\x80\x80"), 1u);  // above U+10FFFF
  EXPECT_EQ(find_invalid_utf8("\xE2\x82"), 0u);           // truncated
}

TEST(Utf8, ReplacesMaximalSubpartsLikePython) {
  // Expected values: Python 3 bytes.decode("utf-8", "replace").
  using dst::data::replace_invalid_utf8;
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(replace_invalid_utf8("\xE0\x80"), r + r);
  EXPECT_EQ(replace_invalid_utf8("\xF0\x9F\x98"), r);
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), r + r + r);
  EXPECT_EQ(replace_invalid_utf8("a\xFF"
                                 "b"),
            "a" + r + "b");
  EXPECT_EQ(replace_invalid_utf8("\xC3"), r);
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), r + r);
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82\xAC\xE2\x82"), "\xE2\x82\xAC" + r);
}

// ---- regex translation and splitting ----

std::vector<std::string> split(const std::string& onig, const std::string& text,
                               detail::SplitBehavior b = detail::SplitBehavior::kIsolated,
                               bool invert = false) {
  const detail::Regex re(detail::onig_to_pcre2(onig, "test"), "test");
  detail::MatchScratch ms;
  std::vector<std::string_view> out;
  detail::split_by_regex(text, re, b, invert, ms, out);
  return {out.begin(), out.end()};
}

TEST(Regex, WhitespaceIsUnicodeWhiteSpaceAsInOniguruma) {
  // tokenizers: Split(Regex(r"\s+"), "isolated") on this text. U+180E is not white
  // space (PCRE2's own \s would take it); NEL U+0085 and NBSP are.
  const std::vector<std::string> want{
      "a\xE1\xA0\x8E"
      "b",
      " \xC2\xA0 ", "x", "\xC2\x85", "y"};
  EXPECT_EQ(split("\\s+",
                  "a\xE1\xA0\x8E"
                  "b \xC2\xA0 x\xC2\x85y"),
            want);
}

TEST(Regex, DollarAndCaretAreLineAnchorsAsInRuby) {
  // tokenizers: Split(Regex(r"\s+$")) on "a  \nb  \r\nc  ".
  const std::vector<std::string> want{"a", "  ", "\nb", "  \r", "\nc", "  "};
  EXPECT_EQ(split("\\s+$", "a  \nb  \r\nc  "), want);
  const std::vector<std::string> want2{"a\n", "b", " b"};
  EXPECT_EQ(split("^b", "a\nb b"), want2);
}

TEST(Regex, TranslationRefusesWhatPcre2CannotExpress) {
  EXPECT_NE(error_of([] { detail::onig_to_pcre2("[^\\S]", "p"); }).find("inside a character class"),
            std::string::npos);
  EXPECT_NE(error_of([] { detail::onig_to_pcre2("[a-z&&[^aeiou]]", "p"); }), "");
  EXPECT_EQ(detail::onig_to_pcre2("\\u4e00[\\s\\]]", "p"),
            "\\x{4e00}[\\p{Z}\\t\\n\\x0B\\f\\r\\x{85}\\]]");
  const std::string msg = error_of([] { detail::Regex("(unclosed", "my pattern"); });
  EXPECT_NE(msg.find("my pattern"), std::string::npos) << msg;
  EXPECT_NE(msg.find("offset"), std::string::npos) << msg;
}

TEST(Regex, SplitBehavioursMatchTokenizers) {
  // tokenizers: Split("-", behavior, invert).pre_tokenize_str("the-final--countdown-").
  using B = detail::SplitBehavior;
  const std::string t = "the-final--countdown-";
  using V = std::vector<std::string>;
  EXPECT_EQ(split("-", t, B::kRemoved), (V{"the", "final", "countdown"}));
  EXPECT_EQ(split("-", t, B::kRemoved, true), (V{"-", "-", "-", "-"}));
  EXPECT_EQ(split("-", t, B::kIsolated), (V{"the", "-", "final", "-", "-", "countdown", "-"}));
  EXPECT_EQ(split("-", t, B::kMergedWithPrevious), (V{"the-", "final-", "-", "countdown-"}));
  EXPECT_EQ(split("-", t, B::kMergedWithPrevious, true),
            (V{"the", "-final", "-", "-countdown", "-"}));
  EXPECT_EQ(split("-", t, B::kMergedWithNext), (V{"the", "-final", "-", "-countdown", "-"}));
  EXPECT_EQ(split("-", t, B::kMergedWithNext, true), (V{"the-", "final-", "-", "countdown-"}));
  EXPECT_EQ(split("-", t, B::kContiguous), (V{"the", "-", "final", "--", "countdown", "-"}));
}

// ---- BPE merges ----

TEST(BpeMerge, LinearScanAndHeapAgree) {
  // Random merge tables over a 6-symbol alphabet and random words up to 200 symbols:
  // the two algorithms must pick the same merges in the same order.
  std::mt19937 rng(12345);
  for (int table = 0; table < 20; ++table) {
    detail::MergeTable merges;
    TokenId next_id = 6;
    std::uniform_int_distribution<int> pick(0, 5 + 20);
    for (std::uint32_t rank = 0; rank < 40; ++rank) {
      const TokenId l = pick(rng) % next_id, r = pick(rng) % next_id;
      merges.insert(l, r, rank, next_id++);
    }
    detail::MergeScratch s;
    for (int w = 0; w < 50; ++w) {
      std::vector<TokenId> word(1 + rng() % 200);
      for (auto& id : word)
        id = static_cast<TokenId>(rng() % 6);
      auto a = word, b = word;
      detail::bpe_merge_linear(a, merges, s);
      detail::bpe_merge_heap(b, merges, s);
      ASSERT_EQ(a, b) << "table " << table << " word " << w;
    }
  }
}

TEST(BpeMerge, LowestRankFirstLeftmostOnTies) {
  detail::MergeTable m;
  m.insert(0, 0, 0, 10);  // "a a" -> 10
  m.insert(10, 0, 1, 11);
  detail::MergeScratch s;
  std::vector<TokenId> w{0, 0, 0};  // "aaa" -> (aa)a -> aaa
  detail::bpe_merge_linear(w, m, s);
  EXPECT_EQ(w, (std::vector<TokenId>{11}));
  std::vector<TokenId> w4{0, 0, 0, 0, 0};  // leftmost pairs first: (aa)(aa)a -> ...
  auto h = w4;
  detail::bpe_merge_linear(w4, m, s);
  detail::bpe_merge_heap(h, m, s);
  EXPECT_EQ(w4, (std::vector<TokenId>{10, 11}));
  EXPECT_EQ(h, w4);
}

// ---- BPE tokenizer ----

TEST(BpeTokenizer, MatchesTokenizersOnTinyModel) {
  const auto tok = BpeTokenizer::from_file(kTiny);
  EXPECT_EQ(tok->vocab_size(), 603);
  // Ids from tokenizers 0.23.3 for the same file and text (added tokens included).
  EXPECT_EQ(
      tok->encode("Hello world, 12345 \xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C!\r\n\tcode "
                  "<|begin|>x<tool>y<|end|>"),
      (std::vector<TokenId>{39, 68,  367, 78,  396, 75,  67,  11,  220, 16,  427, 19,
                            20, 220, 375, 254, 161, 98,  121, 291, 244, 163, 243, 234,
                            0,  311, 197, 66,  78,  341, 220, 600, 87,  602, 88,  601}));
  EXPECT_EQ(tok->encode("    def f(x):\n        return x  \n"),
            (std::vector<TokenId>{265, 309, 68, 69, 302, 7, 87, 8, 497, 334, 384, 83, 368, 77, 220,
                                  87, 256, 198}));
  EXPECT_EQ(tok->encode("\xC3\xA9moji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD done"),
            (std::vector<TokenId>{127, 102, 76, 78, 73, 72, 220, 274, 246, 222, 274, 239, 235, 274,
                                  237, 121, 309, 272, 68}));
  // U+180E stays inside the word; NBSP and NEL are white space.
  EXPECT_EQ(tok->encode("a\xE1\xA0\x8E"
                        "b \xC2\xA0 x\xC2\x85y"),
            (std::vector<TokenId>{64, 157, 254, 236, 65, 220, 126, 254, 220, 87, 126, 227, 88}));
}

TEST(BpeTokenizer, DecodeRoundTripsAndSkipsSpecials) {
  const auto tok = BpeTokenizer::from_file(kTiny);
  const std::string corpus = read(kData + "/corpus.txt");
  ASSERT_GT(corpus.size(), 100000u);
  EXPECT_EQ(tok->decode(tok->encode(corpus)), corpus);
  const auto ids = tok->encode("a<|begin|>b<tool>");
  EXPECT_EQ(tok->decode(ids), "a<|begin|>b<tool>");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), "ab<tool>");  // <tool> is not special
  EXPECT_TRUE(tok->is_special(600));
  EXPECT_FALSE(tok->is_special(602));
  EXPECT_NE(error_of([&] { tok->decode(std::vector<TokenId>{603}); }).find("id 603"),
            std::string::npos);
}

TEST(BpeTokenizer, InvalidUtf8IsEncodedAsItsReplacement) {
  const auto tok = BpeTokenizer::from_file(kTiny);
  const std::string bad = "ok \xFF\xE2\x82 caf\xC3\xA9 \xED\xA0\x80!";
  EXPECT_EQ(tok->encode(bad), tok->encode(dst::data::replace_invalid_utf8(bad)));
  EXPECT_EQ(tok->decode(tok->encode(bad)), dst::data::replace_invalid_utf8(bad));
}

TEST(BpeTokenizer, LongPiecesUseTheHeapAndAgreeWithCache) {
  const auto tok = BpeTokenizer::from_file(kTiny);
  // 5000 spaces is one piece (far beyond the linear-scan and cache limits); encoding it
  // twice, and as part of a longer text, gives the same ids.
  const std::string spaces(5000, ' ');
  const auto a = tok->encode(spaces + "x");
  EXPECT_EQ(tok->encode(spaces + "x"), a);
  EXPECT_EQ(tok->decode(a), spaces + "x");
}

TEST(BpeTokenizer, AddSpecialFollowsTokenizerConfig) {
  const std::string json = read(kTiny);
  const auto plain = BpeTokenizer::from_json(json, "tiny");
  EXPECT_EQ(plain->encode("hi", true), plain->encode("hi"));  // no template, no config
  const auto tok = BpeTokenizer::from_json(
      json, "tiny",
      R"({"add_bos_token": true, "add_eos_token": true, "bos_token": {"content": "<|begin|>"},
          "eos_token": "<|end|>"})");
  auto want = tok->encode("hi");
  want.insert(want.begin(), 600);
  want.push_back(601);
  EXPECT_EQ(tok->encode("hi", true), want);
  EXPECT_EQ(tok->bos_id(), 600);
  EXPECT_EQ(tok->eos_id(), 601);
}

TEST(BpeTokenizer, ThreadsShareOneTokenizer) {
  const auto tok = BpeTokenizer::from_file(kTiny);
  const std::string corpus = read(kData + "/corpus.txt");
  const auto want = tok->encode(corpus);
  std::vector<std::vector<TokenId>> got(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] { got[t] = tok->encode(corpus); });
  for (auto& th : threads)
    th.join();
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(got[1], want);
}

// ---- malformed files: each error names the file and what is wrong ----

class MalformedTokenizer : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!path_.empty()) std::remove(path_.c_str());
  }
  /// Writes `json` to a file and returns the message of loading it.
  std::string load_error(const std::string& json) {
    path_ = ::testing::TempDir() + "bad-tokenizer-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json";
    std::ofstream(path_, std::ios::binary) << json;
    return error_of([&] { BpeTokenizer::from_file(path_); });
  }
  /// The tiny model, edited by `edit`.
  template <class Edit>
  std::string tiny_with(Edit&& edit) {
    auto j = nlohmann::json::parse(read(kTiny));
    edit(j);
    return j.dump();
  }
  void expect_error(const std::string& json, const std::vector<std::string>& parts) {
    const std::string msg = load_error(json);
    ASSERT_FALSE(msg.empty()) << "loaded without error";
    EXPECT_NE(msg.find(path_), std::string::npos) << msg;
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << p << " | " << msg;
  }
  std::string path_;
};

TEST_F(MalformedTokenizer, MissingFile) {
  const std::string msg = error_of([] { BpeTokenizer::from_file("/nonexistent/tokenizer.json"); });
  EXPECT_NE(msg.find("/nonexistent/tokenizer.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
}

TEST_F(MalformedTokenizer, NotJson) {
  expect_error("{\"model\": [1, 2", {"not valid JSON"});
}

TEST_F(MalformedTokenizer, NoModel) {
  expect_error(R"({"pre_tokenizer": null, "decoder": null})", {"model", "missing"});
}

TEST_F(MalformedTokenizer, MergeNotInVocab) {
  expect_error(tiny_with([](auto& j) { j["model"]["merges"][5][1] = "zzz"; }),
               {"model.merges[5]", "\"zzz\" is not in model.vocab"});
}

TEST_F(MalformedTokenizer, MergeStringWithoutSpace) {
  expect_error(tiny_with([](auto& j) { j["model"]["merges"][7] = "ab"; }),
               {"model.merges[7]", "exactly one space"});
}

TEST_F(MalformedTokenizer, BadId) {
  expect_error(tiny_with([](auto& j) { j["model"]["vocab"]["!"] = "zero"; }),
               {"model.vocab[\"!\"]", "token id"});
}

TEST_F(MalformedTokenizer, MissingByteToken) {
  expect_error(tiny_with([](auto& j) { j["model"]["vocab"].erase("!"); }),
               {"model.vocab", "byte 0x21"});
}

TEST_F(MalformedTokenizer, UnsupportedNormalizer) {
  expect_error(tiny_with([](auto& j) {
                 j["normalizer"] = {{"type", "NFKC"}};
               }),
               {"normalizer", "NFKC"});
}

TEST_F(MalformedTokenizer, UnsupportedPreTokenizer) {
  expect_error(
      tiny_with([](auto& j) { j["pre_tokenizer"]["pretokenizers"][1]["type"] = "Whitespace"; }),
      {"pre_tokenizer.pretokenizers[1].type", "Whitespace"});
}

TEST_F(MalformedTokenizer, ByteLevelNotLast) {
  expect_error(tiny_with([](auto& j) {
                 auto& l = j["pre_tokenizer"]["pretokenizers"];
                 l.push_back(l[0]);
               }),
               {"pre_tokenizer.pretokenizers[4]", "after the ByteLevel"});
}

TEST_F(MalformedTokenizer, BadRegex) {
  expect_error(tiny_with([](auto& j) {
                 j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{Nope}+";
               }),
               {"pre_tokenizer.pretokenizers[0].pattern", "PCRE2 cannot compile"});
}

TEST_F(MalformedTokenizer, UnsupportedAddedTokenFlag) {
  expect_error(tiny_with([](auto& j) { j["added_tokens"][0]["lstrip"] = true; }),
               {"added_tokens[0].lstrip", "<|begin|>"});
}

TEST_F(MalformedTokenizer, NotByteLevel) {
  expect_error(tiny_with([](auto& j) {
                 j["decoder"] = {{"type", "WordPiece"}};
               }),
               {"decoder", "ByteLevel"});
}

TEST_F(MalformedTokenizer, BadTemplate) {
  expect_error(tiny_with([](auto& j) {
                 j["post_processor"] = nlohmann::json::parse(
                     R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                         {"Sequence": {"id": "A"}}], "pair": [], "special_tokens": {}})");
               }),
               {"post_processor.special_tokens", "\"<s>\""});
}

// Found by fuzz_tokenizer_json (docs/fuzzing.md): a template id that is no token made
// encode(add_special) return ids that decode() refuses.
TEST_F(MalformedTokenizer, TemplateIdNotAToken) {
  expect_error(tiny_with([](auto& j) {
                 j["post_processor"] = nlohmann::json::parse(
                     R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                         {"Sequence": {"id": "A"}}], "pair": [],
                         "special_tokens": {"<s>": {"id": "<s>", "ids": [603]}}})");
               }),
               {"post_processor.special_tokens.<s>.ids", "id 603 is not a token"});
}

// Found with fuzz_tokenizer_json's harness: a 200k-deep array where an object was expected
// overflowed the stack when the error message quoted it (json::dump recurses). Refused
// before parsing; brackets inside strings do not count.
TEST_F(MalformedTokenizer, NestingTooDeep) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  expect_error(R"({"added_tokens": [], "decoder": )" + deep + "}", {"nests deeper than 64"});
  const std::string msg = error_of([] {
    BpeTokenizer::from_json(R"({"x": ")" + std::string(1000, '[') + R"("})", "in-string");
  });
  EXPECT_EQ(msg.find("nests deeper"), std::string::npos) << msg;
}

// Found by fuzz_tokenizer_json: one huge id sized the id table (2e9 entries, out of memory).
TEST_F(MalformedTokenizer, HugeIdRefusedBeforeAllocating) {
  expect_error(tiny_with([](auto& j) { j["model"]["vocab"]["zzz"] = 2000000000; }),
               {"model.vocab", "ids reach 2000000000", "unused ids"});
}

}  // namespace
