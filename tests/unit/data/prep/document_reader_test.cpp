// The input readers of `dstrain prep`: what a document is in each format, where it
// starts, and the errors (file, line, byte offset) for bad inputs.
#include "data/prep/document_reader.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/prep/prepare.hpp"
#include "dataset_test_util.hpp"  // ScratchDir

namespace dst::data {
namespace {

using test::ScratchDir;

void write(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

struct Doc {
  std::string text;
  std::uint64_t line, offset;
};

std::vector<Doc> read_all(const std::string& path, const InputOptions& o) {
  DocumentReader r(path, o);
  std::vector<Doc> docs;
  while (r.next(true))
    docs.push_back({r.text(), r.line(), r.offset()});
  return docs;
}

/// The message of the InputError that reading `path` throws ("" if none).
std::string read_error(const std::string& path, const InputOptions& o) {
  try {
    read_all(path, o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

InputOptions text_with(const std::string& sep, Utf8Policy utf8 = Utf8Policy::error) {
  InputOptions o;
  o.separator = sep;
  o.utf8 = utf8;
  return o;
}

InputOptions jsonl_with(const std::string& field, Utf8Policy utf8 = Utf8Policy::error) {
  InputOptions o;
  o.format = InputFormat::jsonl;
  o.field = field;
  o.utf8 = utf8;
  return o;
}

TEST(PrepReader, SeparatorLinesSplitDocuments) {
  ScratchDir dir("prep_sep");
  // Leading and doubled separators make no empty document; CRLF separators count; the
  // last line gets its newline, as data.format text reads it.
  write(dir.file("a.txt"), "%\nfirst\n%\nsecond\nline two\n%\n%\r\nthird");
  const auto docs = read_all(dir.file("a.txt"), text_with("%"));
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "first\n");
  EXPECT_EQ(docs[0].line, 2u);
  EXPECT_EQ(docs[0].offset, 2u);
  EXPECT_EQ(docs[1].text, "second\nline two\n");
  EXPECT_EQ(docs[1].line, 4u);
  EXPECT_EQ(docs[1].offset, 10u);
  EXPECT_EQ(docs[2].text, "third\n");
  EXPECT_EQ(docs[2].line, 8u);
}

TEST(PrepReader, WholeFileIsOneDocumentAndEmptyFilesNone) {
  ScratchDir dir("prep_whole");
  write(dir.file("a.txt"), "all of it\n%\nstill it");
  write(dir.file("empty.txt"), "");
  const auto docs = read_all(dir.file("a.txt"), InputOptions{});
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(docs[0].text, "all of it\n%\nstill it");
  EXPECT_TRUE(read_all(dir.file("empty.txt"), InputOptions{}).empty());
  // Skipping (another rank's document) covers the same bytes without reading them.
  DocumentReader r(dir.file("a.txt"), InputOptions{});
  ASSERT_TRUE(r.next(false));
  EXPECT_EQ(r.bytes_scanned(), 20u);
  EXPECT_FALSE(r.next(false));
}

TEST(PrepReader, DirectoryExpandsToSortedVisibleFiles) {
  ScratchDir dir("prep_dir");
  write(dir.file("corpus/b.txt"), "b");
  write(dir.file("corpus/a.txt"), "a");
  write(dir.file("corpus/sub/c.txt"), "c");
  write(dir.file("corpus/.hidden"), "h");
  write(dir.file("corpus/.git/x"), "x");
  write(dir.file("single.txt"), "s");
  const auto files = expand_inputs({dir.file("single.txt"), dir.file("corpus"), "-"});
  const std::vector<std::string> want = {dir.file("single.txt"), dir.file("corpus/a.txt"),
                                         dir.file("corpus/b.txt"), dir.file("corpus/sub/c.txt"),
                                         "-"};
  EXPECT_EQ(files, want);
}

TEST(PrepReader, MissingInputAndEmptyDirectoryAreNamed) {
  ScratchDir dir("prep_missing");
  try {
    expand_inputs({dir.file("nope.txt")});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.txt"), std::string::npos) << e.what();
  }
  std::filesystem::create_directories(dir.file("empty"));
  EXPECT_THROW(expand_inputs({dir.file("empty")}), InputError);
}

TEST(PrepReader, UnreadableFileIsNamed) {
  ScratchDir dir("prep_unreadable");
  try {
    DocumentReader r(dir.file("gone.txt"), InputOptions{});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open '" + dir.file("gone.txt") + "'"),
              std::string::npos)
        << e.what();
  }
  // A directory opens but cannot be read: a read error naming it, not a crash or EOF.
  std::filesystem::create_directories(dir.file("adir"));
  const std::string msg = read_error(dir.file("adir"), text_with("%"));
  EXPECT_NE(msg.find(dir.file("adir") + ":1: read error"), std::string::npos) << msg;
}

TEST(PrepReader, JsonLinesWithCustomField) {
  ScratchDir dir("prep_jsonl");
  write(dir.file("c.jsonl"),
        "\xEF\xBB\xBF{\"body\": \"one\\nline\", \"id\": 1}\n"
        "\n"
        "   \r\n"
        "{\"id\": 2, \"body\": \"caf\\u00e9 \xE2\x82\xAC\"}\r\n"
        "{\"body\": \"\"}");
  const auto docs = read_all(dir.file("c.jsonl"), jsonl_with("body"));
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0].text, "one\nline");
  EXPECT_EQ(docs[0].line, 1u);
  EXPECT_EQ(docs[0].offset, 3u);  // after the byte order mark
  EXPECT_EQ(docs[1].text, "caf\xC3\xA9 \xE2\x82\xAC");
  EXPECT_EQ(docs[1].line, 4u);
  EXPECT_EQ(docs[2].text, "");  // a JSON line is a document even when its text is empty
  EXPECT_EQ(docs[2].line, 5u);
}

TEST(PrepReader, MalformedJsonLineNamesFileAndLine) {
  ScratchDir dir("prep_badjson");
  write(dir.file("bad.jsonl"), "{\"text\": \"ok\"}\n{\"text\": \"fine\"}\n{\"text\": \"oops}\n");
  const std::string msg = read_error(dir.file("bad.jsonl"), jsonl_with("text"));
  EXPECT_NE(msg.find(dir.file("bad.jsonl") + ":3: malformed JSON at column "), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("byte offset"), std::string::npos) << msg;
}

TEST(PrepReader, MissingOrNonStringFieldIsNamed) {
  ScratchDir dir("prep_field");
  write(dir.file("a.jsonl"), "{\"text\": \"ok\"}\n{\"content\": \"x\"}\n");
  std::string msg = read_error(dir.file("a.jsonl"), jsonl_with("text"));
  EXPECT_NE(msg.find("a.jsonl:2: no member \"text\""), std::string::npos) << msg;
  write(dir.file("b.jsonl"), "{\"text\": 42}\n");
  msg = read_error(dir.file("b.jsonl"), jsonl_with("text"));
  EXPECT_NE(msg.find("b.jsonl:1: member \"text\" is number, not a string"), std::string::npos)
      << msg;
  write(dir.file("c.jsonl"), "[\"text\"]\n");
  msg = read_error(dir.file("c.jsonl"), jsonl_with("text"));
  EXPECT_NE(msg.find("c.jsonl:1: a JSON Lines document must be an object"), std::string::npos)
      << msg;
}

TEST(PrepReader, InvalidUtf8NamesLineAndByteOffset) {
  ScratchDir dir("prep_utf8");
  // Document 2 starts at byte 7 (line 3); its 0xFF is on line 4 at byte 7 + 5 + 4 = 16.
  write(dir.file("t.txt"), "good\n%\nfine\nbad \xFF here\n");
  std::string msg = read_error(dir.file("t.txt"), text_with("%"));
  EXPECT_NE(msg.find("t.txt:4: invalid UTF-8 (byte 0xff)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(byte offset 16)"), std::string::npos) << msg;
  // replace: U+FFFD; keep: the byte as it is.
  auto docs = read_all(dir.file("t.txt"), text_with("%", Utf8Policy::replace));
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1].text, "fine\nbad \xEF\xBF\xBD here\n");
  docs = read_all(dir.file("t.txt"), text_with("%", Utf8Policy::keep));
  EXPECT_EQ(docs[1].text, "fine\nbad \xFF here\n");

  write(dir.file("j.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"b\xC3\"}\n");
  msg = read_error(dir.file("j.jsonl"), jsonl_with("text"));
  EXPECT_NE(msg.find("j.jsonl:2: invalid UTF-8 (byte 0xc3)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(byte offset 25)"), std::string::npos) << msg;
  docs = read_all(dir.file("j.jsonl"), jsonl_with("text", Utf8Policy::replace));
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[1].text, "b\xEF\xBF\xBD");
}

TEST(PrepSplit, HeldOutDocumentsAreEvenlySpread) {
  const ValidSplit every20{1, 20};
  const ValidSplit fraction{50000, 1000000};  // 0.05 as --valid-fraction writes it
  std::uint64_t held = 0;
  for (std::uint64_t i = 0; i < 100000; ++i) {
    EXPECT_EQ(every20.held_out(i), (i + 1) % 20 == 0) << i;
    EXPECT_EQ(fraction.held_out(i), every20.held_out(i)) << i;
    held += every20.held_out(i);
  }
  EXPECT_EQ(held, 5000u);
  EXPECT_FALSE(ValidSplit{}.held_out(0));
}

}  // namespace
}  // namespace dst::data
