#pragma once
/// \file document_reader.hpp
/// The inputs of `dstrain prep` (docs/dataset.md, "Preparing a dataset"): plain text
/// files (one document per file, or documents separated by a separator line) and JSON
/// Lines (one `{"text": ...}` object per line), read one document at a time.
///
/// Reading is split in two so that a rank can skip the documents another rank owns
/// cheaply: next() finds where the next document is (every rank scans every input, so
/// all ranks agree on the global document index), text() decodes it (JSON parsing, the
/// UTF-8 policy), which only the owner does.

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace dst::data {

/// A bad input: a file that cannot be read, a malformed JSON line, invalid UTF-8. The
/// message names the file and the line and/or byte offset.
class InputError : public Error {
 public:
  using Error::Error;
};

enum class InputFormat {
  text,   ///< a file is one document, or documents are separated by `separator` lines
  jsonl,  ///< JSON Lines: every non-blank line is an object whose `field` is the text
};

/// What to do with bytes that are not well-formed UTF-8 (utf8.hpp).
enum class Utf8Policy {
  error,    ///< stop with an InputError naming the file, line and byte offset
  replace,  ///< replace each maximal ill-formed subpart by U+FFFD
  keep,     ///< keep the bytes (text inputs only: JSON text must be UTF-8, RFC 8259)
};

struct InputOptions {
  InputFormat format = InputFormat::text;
  /// text: a line equal to this (a trailing CR ignored) ends a document; empty = one
  /// document per file.
  std::string separator;
  std::string field = "text";  ///< jsonl: the member holding the document's text
  Utf8Policy utf8 = Utf8Policy::error;
};

/// "-" names standard input.
inline constexpr const char* kStdinName = "-";

/// The files `inputs` name, in order: a file as given, a directory as its regular files
/// (recursively, hidden entries skipped, sorted by path in byte order so every rank and
/// every run sees the same order), "-" as itself. Throws InputError naming an input that
/// does not exist, or a directory holding no file.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs);

/// Reads the documents of one input, in order. Not copyable; one per input and thread.
///
///   DocumentReader r("corpus.jsonl", options);
///   while (r.next(/*keep=*/true)) use(r.text(), r.line(), r.offset());
class DocumentReader {
 public:
  /// Opens `path` ("-": standard input). Throws InputError "cannot open '<path>': <why>".
  DocumentReader(std::string path, InputOptions options);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  /// Moves to the next document; false at the end of the input. `keep`: the caller will
  /// call text(); otherwise the document is only located (a one-document file is not
  /// even read when its size is known). Empty text documents (an empty file, two
  /// separators in a row) are skipped; a JSON line is a document even if its text is "".
  /// Throws InputError on a read error.
  bool next(bool keep);

  /// The current document's text (after next(true)): JSON decoded, the UTF-8 policy
  /// applied. Throws InputError naming the file, the line and the byte offset of a
  /// malformed JSON line, a missing or non-string field, or invalid UTF-8 (policy error).
  std::string text();

  /// 1-based line of the current document's first byte.
  std::uint64_t line() const { return doc_line_; }
  /// Byte offset of the current document's first byte in the input.
  std::uint64_t offset() const { return doc_offset_; }
  /// Bytes of the input covered so far (what next() has moved past), the same on every
  /// rank whatever it keeps.
  std::uint64_t bytes_scanned() const { return scanned_; }
  /// The input's name in messages: its path, or "<stdin>".
  const std::string& name() const { return name_; }

 private:
  bool next_line();  // reads line_ (without '\n'); false at the end
  [[noreturn]] void fail(const std::string& what, std::uint64_t line, std::uint64_t offset) const;
  std::string check_utf8(std::string text, std::uint64_t line, std::uint64_t offset,
                         bool count_lines) const;

  std::string path_;
  std::string name_;
  InputOptions options_;
  std::FILE* file_ = nullptr;
  std::vector<char> buffer_;  // stdio buffer
  char* line_buf_ = nullptr;  // getline's buffer
  std::size_t line_cap_ = 0;
  std::size_t line_len_ = 0;       // bytes of the current line, '\n' excluded
  std::uint64_t line_no_ = 0;      // 1-based number of the line in line_buf_
  std::uint64_t line_offset_ = 0;  // byte offset of that line
  std::uint64_t position_ = 0;     // bytes read from the file
  std::uint64_t scanned_ = 0;
  bool whole_file_done_ = false;
  // The current document.
  std::string content_;  // text mode: the document; jsonl: the raw line
  std::uint64_t doc_line_ = 0;
  std::uint64_t doc_offset_ = 0;
  bool kept_ = false;
};

}  // namespace dst::data
