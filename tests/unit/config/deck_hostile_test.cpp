// Hostile decks: every one must end in a clean DeckError (never a crash, a hang or another
// exception type), refused before yaml-cpp's recursive parser sees deep nesting.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "config/deck.hpp"
#include "core/error.hpp"

namespace {

using dst::DeckError;
using dst::config::kMaxDeckBytes;
using dst::config::kMaxDeckDepth;
using dst::config::load_deck_text;

std::string load_error(std::string_view text, const std::vector<std::string>& sets = {}) {
  std::vector<dst::config::Override> overrides;
  for (const std::string& s : sets)
    overrides.push_back(dst::config::parse_override(s));
  try {
    load_deck_text(text, "deck.yaml", overrides);
  } catch (const DeckError& e) {
    return e.what();
  }
  return "<no error>";
}

::testing::AssertionResult Contains(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "'" << text.substr(0, 300) << "' does not contain '" << part << "'";
}

constexpr const char* kDeep = "nests deeper than";

std::string repeat(const std::string& s, int n) {
  std::string out;
  out.reserve(s.size() * static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    out += s;
  return out;
}

TEST(DeckHostile, TwoMegabyteDeck) {
  std::string text = "run:\n  name: x\n";
  text += "# " + std::string(2u << 20, 'a') + "\n";
  EXPECT_TRUE(
      Contains(load_error(text), "more than the limit of " + std::to_string(kMaxDeckBytes)));

  const std::string path = ::testing::TempDir() + "dstrain_big_deck.yaml";
  {
    std::ofstream out(path, std::ios::binary);
    out << text;
  }
  try {
    dst::config::read_deck_file(path);
    ADD_FAILURE() << "no error";
  } catch (const DeckError& e) {
    EXPECT_TRUE(Contains(e.what(), path + ": the deck file is larger than the limit"));
  }
  std::remove(path.c_str());
}

TEST(DeckHostile, MissingFile) {
  EXPECT_THROW(dst::config::load_deck_file("/nonexistent/dstrain/deck.yaml"), DeckError);
}

TEST(DeckHostile, DeepFlowNesting) {
  EXPECT_TRUE(Contains(load_error(std::string(100000, '[')), kDeep));
  EXPECT_TRUE(Contains(load_error("run: " + std::string(100000, '[')), "deck.yaml:1:"));
  EXPECT_TRUE(Contains(load_error("run: " + repeat("{a: ", 100000)), kDeep));
  EXPECT_TRUE(Contains(load_error(repeat("[{", 50000) + repeat("}]", 50000)), kDeep));
  // Shallow enough nesting reaches the parser (and fails on the unknown key, not depth).
  const std::string ok = "bogus: " + std::string(10, '[') + std::string(10, ']') + "\n";
  EXPECT_TRUE(Contains(load_error(ok), "bogus: unknown key"));
  EXPECT_TRUE(Contains(load_error("run: {name: [a, b}\n"), "deck.yaml:1:"));
  EXPECT_TRUE(Contains(load_error("run: [a\n"), "deck.yaml:1:6: unclosed '['"));
}

TEST(DeckHostile, QuotesAndCommentsCannotHideNesting) {
  // Brackets inside quoted strings and comments are not structure ...
  const std::string brackets(kMaxDeckDepth + 8, '[');
  EXPECT_EQ(load_deck_text("run: {name: \"" + brackets + "\"}  # " + brackets + "\n", "deck.yaml")
                .run.name,
            brackets);
  // ... but closing brackets in a string cannot cancel real opening ones,
  const std::string open = std::string(20, '[');
  EXPECT_TRUE(
      Contains(load_error("run: " + open + " \"" + std::string(20, ']') + "\", " + open), kDeep));
  // a quote inside a plain scalar is text, not the start of a string that could hide what
  // follows,
  EXPECT_TRUE(Contains(load_error("run: [a\"b, " + std::string(100000, '[') + " \"]"), kDeep));
  // a plain scalar continued on the next line of a flow collection keeps its quotes text,
  EXPECT_TRUE(Contains(load_error("run: [a\n\"b, " + std::string(100000, '[') + "\"]"), kDeep));
  // and a quoted string may not run on over lines that YAML might read as structure.
  EXPECT_TRUE(Contains(load_error("run:\n  name: x\n  \"y\n" + std::string(100000, '[') + "\n\""),
                       "must end on the line it starts"));
}

TEST(DeckHostile, DeepBlockNesting) {
  // Indentation alone: 1000 levels fit the size limit (5000 would need 12 MB).
  std::string indented;
  for (int i = 0; i < 1000; ++i)
    indented += std::string(static_cast<std::size_t>(i), ' ') + "a:\n";
  EXPECT_TRUE(Contains(load_error(indented), kDeep));
  std::string dashes;
  for (int i = 0; i < 1000; ++i)
    dashes += std::string(static_cast<std::size_t>(i), ' ') + "-\n";
  EXPECT_TRUE(Contains(load_error(dashes), kDeep));

  // Compact block nesting, 5000 and 100000 deep.
  EXPECT_TRUE(Contains(load_error(repeat("- ", 100000) + "x\n"), kDeep));
  EXPECT_TRUE(Contains(load_error(repeat("- ", 5000) + "x\n"), kDeep));
  EXPECT_TRUE(Contains(load_error("run:\n  name: " + repeat("- ", 5000) + "x\n"), kDeep));
  EXPECT_TRUE(Contains(load_error(repeat("? ", 5000) + "x\n"), kDeep));
  EXPECT_TRUE(Contains(load_error(repeat("- a: ", 5000) + "x\n"), kDeep));

  // The limit is not hit by an ordinary deck's three levels (training.optimizer.lr).
  EXPECT_NO_THROW(load_deck_text("training:\n  optimizer:\n    lr: 0.1\n", "deck.yaml"));
  static_assert(kMaxDeckDepth >= 16, "ordinary decks need a few levels");
}

TEST(DeckHostile, BlockScalarContentIsText) {
  // Block scalar text is not structure; the deck then fails on the unknown key.
  const std::string text =
      "bogus: |\n  [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n  \"unterminated\nrun: {}\n";
  EXPECT_TRUE(Contains(load_error(text), "bogus: unknown key"));
}

TEST(DeckHostile, InvalidUtf8AndNul) {
  EXPECT_EQ(load_error("run:\n  name: ab\xff\xfe\n"), "deck.yaml:2:11: invalid UTF-8 (byte 0xff)");
  EXPECT_TRUE(Contains(load_error("run:\n  name: \xc0\xaf\n"), "invalid UTF-8"));      // overlong
  EXPECT_TRUE(Contains(load_error("run:\n  name: \xed\xa0\x80\n"), "invalid UTF-8"));  // surrogate
  EXPECT_TRUE(Contains(load_error("run:\n  name: \xe2\x82\n"), "invalid UTF-8"));      // truncated
  EXPECT_EQ(load_error(std::string("run:\n  na\0me: x\n", 16)),
            "deck.yaml:2:5: NUL byte in the deck");
  // Valid UTF-8 is fine.
  EXPECT_EQ(load_deck_text("run:\n  name: \"r\xc3\xa9sum\xc3\xa9 \xe2\x9c\x93\"\n", "d").run.name,
            "r\xc3\xa9sum\xc3\xa9 \xe2\x9c\x93");
}

TEST(DeckHostile, EmptyScalarAndListDecks) {
  EXPECT_TRUE(Contains(load_error(""), "deck.yaml: the deck is empty"));
  EXPECT_TRUE(Contains(load_error("# only a comment\n\n"), "the deck is empty"));
  EXPECT_TRUE(Contains(load_error("hello\n"),
                       "deck.yaml:1:1: a deck must be a mapping of sections (run:, model:, ...), "
                       "got 'hello'"));
  EXPECT_TRUE(Contains(load_error("- run\n- model\n"), "a deck must be a mapping"));
  EXPECT_TRUE(Contains(load_error("- run\n- model\n"), "got a list"));
  EXPECT_TRUE(Contains(load_error("42"), "got '42'"));
}

TEST(DeckHostile, BillionLaughsIsRefused) {
  std::string text =
      "a: &a [\"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\", \"lol\"]\n";
  const char* names = "abcdefghi";
  for (int i = 1; i < 9; ++i) {
    text += std::string(1, names[i]) + ": &" + names[i] + " [";
    for (int j = 0; j < 9; ++j)
      text += std::string(j ? ", *" : "*") + names[i - 1];
    text += "]\n";
  }
  EXPECT_TRUE(Contains(load_error(text), "deck.yaml:1:4: YAML anchors (&a) are not supported"));
}

TEST(DeckHostile, HostileOverrides) {
  EXPECT_TRUE(Contains(load_error("run: {}\n", {"run.name=" + std::string(100000, '[')}),
                       "--set run.name=[[[["));
  EXPECT_TRUE(Contains(load_error("run: {}\n", {"run.name=" + std::string(100000, '[')}), kDeep));
  EXPECT_TRUE(Contains(load_error("run: {}\n", {"run.name=\xff"}), "invalid UTF-8"));
  EXPECT_TRUE(
      Contains(load_error("run: {}\n", {"run.name=a\n---\nb"}), "more than one YAML document"));
  EXPECT_TRUE(Contains(load_error("run: {}\n", {"run.name=" + std::string(2u << 20, 'x')}),
                       "more than the limit"));
}

TEST(DeckHostile, RandomMutationsOnlyGiveDeckErrors) {
  // Byte-level mutations of a valid deck: whatever the parser makes of them, the only
  // failure allowed is a DeckError. Fixed seed, so a failure reproduces.
  const std::string base =
      "run: {name: x, seed: 1}\nmodel:\n  preset: tiny\n  d_model: 256\n"
      "training:\n  optimizer: {lr: 3.0e-4, betas: [0.9, 0.95]}\n  schedule:\n"
      "    milestones: [0.5, 0.75]\n    factors: [0.5, 0.1]\nparallel: {data: auto}\n";
  const std::string alphabet = "[]{}:,-?#&*!|>'\"\\ \n\t.0a\x80\xff";
  std::mt19937 rng(1234);
  int accepted = 0;
  for (int iteration = 0; iteration < 2000; ++iteration) {
    std::string text = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % text.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          text[pos] = c;
          break;
        case 1:
          text.insert(pos, 1 + rng() % 40, c);
          break;
        default:
          text.erase(pos, 1);
      }
    }
    try {
      load_deck_text(text, "fuzz.yaml");
      ++accepted;
    } catch (const DeckError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a DeckError: " << e.what() << "\n" << text;
    }
  }
  EXPECT_GT(accepted, 0);  // some mutations (in comments, names) keep the deck valid
}

}  // namespace
