#include "data/prep/document_reader.hpp"

#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>

#include "data/tokenizer/utf8.hpp"

namespace dst::data {

namespace fs = std::filesystem;

namespace {

/// stdio buffer per input: 1 MiB makes each read(2) large enough that scanning a
/// many-gigabyte corpus costs little system time (64 KiB already reaches ~95%).
constexpr std::size_t kReadBuffer = std::size_t{1} << 20;

bool is_blank(const char* s, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return false;
  return true;
}

/// nlohmann's message without its "[json.exception.parse_error.101] parse error at line
/// 1, column 7: " prefix (we give the file's line and the column ourselves).
std::string json_reason(const char* what) {
  std::string s = what;
  const auto col = s.find("column ");
  if (col != std::string::npos) {
    const auto colon = s.find(": ", col);
    if (colon != std::string::npos) return s.substr(colon + 2);
  }
  const auto bracket = s.find("] ");
  return bracket == std::string::npos ? s : s.substr(bracket + 2);
}

}  // namespace

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> out;
  for (const auto& input : inputs) {
    if (input == kStdinName) {
      out.push_back(input);
      continue;
    }
    std::error_code ec;
    const auto status = fs::status(input, ec);
    if (ec || !fs::exists(status))
      throw InputError("prep: input '" + input +
                       "': " + (ec ? ec.message() : std::string("no such file or directory")));
    if (!fs::is_directory(status)) {
      out.push_back(input);
      continue;
    }
    std::vector<std::string> files;
    fs::recursive_directory_iterator it(input, fs::directory_options::none, ec), end;
    if (ec) throw InputError("prep: cannot list directory '" + input + "': " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) throw InputError("prep: cannot list directory '" + input + "': " + ec.message());
      // Hidden entries are editor back-ups, VCS folders and the like, not corpus.
      if (it->path().filename().string().rfind('.', 0) == 0) {
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      if (it->is_regular_file(ec)) files.push_back(it->path().string());
    }
    if (files.empty()) throw InputError("prep: directory '" + input + "' holds no files");
    std::sort(files.begin(), files.end());  // byte order: the same on every rank and run
    out.insert(out.end(), files.begin(), files.end());
  }
  return out;
}

DocumentReader::DocumentReader(std::string path, InputOptions options)
    : path_(std::move(path)), options_(std::move(options)) {
  if (path_ == kStdinName) {
    name_ = "<stdin>";
    file_ = stdin;
  } else {
    name_ = path_;
    file_ = std::fopen(path_.c_str(), "rb");
    if (!file_) throw InputError("prep: cannot open '" + name_ + "': " + std::strerror(errno));
  }
  buffer_.resize(kReadBuffer);
  std::setvbuf(file_, buffer_.data(), _IOFBF, buffer_.size());
}

DocumentReader::~DocumentReader() {
  std::free(line_buf_);
  if (file_ && file_ != stdin) std::fclose(file_);
}

void DocumentReader::fail(const std::string& what, std::uint64_t line, std::uint64_t offset) const {
  throw InputError("prep: " + name_ + ":" + std::to_string(line) + ": " + what + " (byte offset " +
                   std::to_string(offset) + ")");
}

bool DocumentReader::next_line() {
  errno = 0;
  const ssize_t n = ::getline(&line_buf_, &line_cap_, file_);
  if (n < 0) {
    if (std::ferror(file_))
      fail(std::string("read error: ") + std::strerror(errno ? errno : EIO), line_no_ + 1,
           position_);
    return false;
  }
  line_offset_ = position_;
  position_ += static_cast<std::uint64_t>(n);
  scanned_ = position_;
  ++line_no_;
  line_len_ = static_cast<std::size_t>(n);
  if (line_len_ > 0 && line_buf_[line_len_ - 1] == '\n') --line_len_;
  return true;
}

bool DocumentReader::next(bool keep) {
  kept_ = keep;
  content_.clear();
  if (options_.format == InputFormat::jsonl) {
    while (next_line()) {
      // A UTF-8 byte order mark before the first object is common and not JSON.
      std::size_t skip = 0;
      if (line_no_ == 1 && line_len_ >= 3 && std::memcmp(line_buf_, "\xEF\xBB\xBF", 3) == 0)
        skip = 3;
      if (is_blank(line_buf_ + skip, line_len_ - skip)) continue;
      doc_line_ = line_no_;
      doc_offset_ = line_offset_ + skip;
      if (keep) content_.assign(line_buf_ + skip, line_len_ - skip);
      return true;
    }
    return false;
  }

  if (options_.separator.empty()) {  // the whole file is one document
    if (whole_file_done_) return false;
    whole_file_done_ = true;
    doc_line_ = 1;
    doc_offset_ = 0;
    struct stat st {};
    const bool regular = ::fstat(fileno(file_), &st) == 0 && S_ISREG(st.st_mode);
    if (regular && !keep) {  // located without reading: other ranks read it
      scanned_ = static_cast<std::uint64_t>(st.st_size);
      return st.st_size > 0;
    }
    char chunk[1 << 16];
    std::size_t n;
    errno = 0;
    while ((n = std::fread(chunk, 1, sizeof chunk, file_)) > 0)
      content_.append(chunk, n);
    if (std::ferror(file_))
      fail(std::string("read error: ") + std::strerror(errno ? errno : EIO), 1, content_.size());
    // Every rank must count the same bytes: the size it would have used unread.
    scanned_ = regular ? static_cast<std::uint64_t>(st.st_size) : content_.size();
    return !content_.empty();
  }

  // Documents separated by lines equal to the separator.
  const std::string& sep = options_.separator;
  bool any = false;
  while (next_line()) {
    const bool is_sep = (line_len_ == sep.size() ||
                         (line_len_ == sep.size() + 1 && line_buf_[sep.size()] == '\r')) &&
                        std::memcmp(line_buf_, sep.data(), sep.size()) == 0;
    if (is_sep) {
      if (any) return true;
      continue;
    }
    if (!any) {
      any = true;
      doc_line_ = line_no_;
      doc_offset_ = line_offset_;
    }
    // Lines keep their newline (one is added to a last line without it), as the
    // deck's data.format text reads them (data/text_corpus.hpp).
    if (keep) content_.append(line_buf_, line_len_).push_back('\n');
  }
  return any;
}

std::string DocumentReader::check_utf8(std::string text, std::uint64_t line, std::uint64_t offset,
                                       bool count_lines) const {
  if (options_.utf8 == Utf8Policy::keep && options_.format == InputFormat::text) return text;
  const std::size_t bad = find_invalid_utf8(text);
  if (bad == std::string::npos) return text;
  if (options_.utf8 == Utf8Policy::replace) return replace_invalid_utf8(text);
  std::uint64_t at_line = line;
  if (count_lines)
    at_line += static_cast<std::uint64_t>(std::count(text.begin(), text.begin() + bad, '\n'));
  fail("invalid UTF-8 (byte 0x" +
           std::string{"0123456789abcdef"[static_cast<unsigned char>(text[bad]) >> 4],
                       "0123456789abcdef"[static_cast<unsigned char>(text[bad]) & 15]} +
           "); --utf8 replace substitutes U+FFFD",
       at_line, offset + bad);
}

std::string DocumentReader::text() {
  if (!kept_) throw Error("DocumentReader::text: the document was skipped (next(false))");
  if (options_.format == InputFormat::text)
    return check_utf8(std::move(content_), doc_line_, doc_offset_, true);

  // JSON text is UTF-8 (RFC 8259): check the raw line first, so the error names the
  // byte, not a JSON parse position.
  const std::string line = check_utf8(std::move(content_), doc_line_, doc_offset_, false);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    const std::uint64_t col = e.byte > 0 ? e.byte : 1;
    fail("malformed JSON at column " + std::to_string(col) + ": " + json_reason(e.what()),
         doc_line_, doc_offset_ + col - 1);
  }
  if (!j.is_object())
    fail(std::string("a JSON Lines document must be an object, got ") + j.type_name(), doc_line_,
         doc_offset_);
  const auto it = j.find(options_.field);
  if (it == j.end())
    fail("no member \"" + options_.field + "\" (choose the member with --field)", doc_line_,
         doc_offset_);
  if (!it->is_string())
    fail("member \"" + options_.field + "\" is " + it->type_name() + ", not a string", doc_line_,
         doc_offset_);
  return it->get<std::string>();
}

}  // namespace dst::data
