#include "config/yaml_tree.hpp"

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/exceptions.h>
#include <yaml-cpp/mark.h>
#include <yaml-cpp/parser.h>

#include <algorithm>
#include <sstream>
#include <utility>

#include "core/error.hpp"

namespace dst::config::detail {

const YamlNode* YamlNode::find(std::string_view key) const {
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i] == key) return &children[i];
  return nullptr;
}

YamlNode* YamlNode::find(std::string_view key) {
  return const_cast<YamlNode*>(static_cast<const YamlNode*>(this)->find(key));
}

std::string TextOrigin::where(long line0, long col0) const {
  if (fixed_where || line0 < 0) return name;
  return name + ":" + std::to_string(line0 + 1) + ":" + std::to_string(col0 + 1);
}

std::string describe(const YamlNode& node) {
  switch (node.kind) {
    case YamlNode::Kind::Null:
      return "null";
    case YamlNode::Kind::Map:
      return "a mapping";
    case YamlNode::Kind::Sequence:
      return "a list";
    case YamlNode::Kind::Scalar:
      break;
  }
  // Long values are cut so one bad key cannot flood the message.
  constexpr std::size_t kShown = 60;
  if (node.value.size() > kShown) return "'" + node.value.substr(0, kShown) + "...'";
  return "'" + node.value + "'";
}

namespace {

// ---------------------------------------------------------------------------------------
// Pre-scan
// ---------------------------------------------------------------------------------------

// Length of the UTF-8 sequence starting at s[i], or 0 if it is not valid UTF-8 (overlong
// forms, surrogates and code points above U+10FFFF are invalid, RFC 3629).
std::size_t utf8_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](std::size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

bool is_blank_at(std::string_view line, std::size_t i) {
  return i >= line.size() || line[i] == ' ' || line[i] == '\t';
}

bool is_flow_indicator(char c) {
  return c == ',' || c == '[' || c == ']' || c == '{' || c == '}';
}

// Bounds the collection nesting yaml-cpp will see, without parsing.
//
// yaml-cpp parses nested collections recursively, so depth is what must be bounded. The
// scan over-estimates on purpose:
//  - flow depth: every `[`/`{` outside quoted scalars and comments opens a level, even
//    where YAML would read it as text of a plain scalar; `]`/`}` close one.
//  - block depth: a stack of indentation columns, one per indentation level and one per
//    block indicator (`- `, `? `, `: `) on the line, since these nest compactly
//    (`- - - x`). A mapping and an "indentless" sequence can share a column, so each
//    column counts twice.
// A quoted scalar is only recognised where a YAML token can start (not inside a plain
// scalar: `don't`), exactly as yaml-cpp's scanner does, and must end on its line: were
// the scan to mistake text for an opening quote it would otherwise skip whole lines that
// yaml-cpp parses as structure. Block scalars (`|`, `>`) are skipped by indentation.
class DepthScanner {
 public:
  DepthScanner(const TextOrigin& origin, int max_depth) : origin_(origin), max_depth_(max_depth) {}

  void scan_line(std::string_view line, long line_no) {
    line_no_ = line_no;
    std::size_t indent = 0;
    while (indent < line.size() && line[indent] == ' ')
      ++indent;
    const bool blank = indent == line.size() || line[indent] == '#';

    if (block_scalar_) {
      if (blank && indent == line.size()) return;
      if (block_content_indent_ < 0 && static_cast<long>(indent) > block_parent_indent_)
        block_content_indent_ = static_cast<long>(indent);
      if (block_content_indent_ >= 0 && static_cast<long>(indent) >= block_content_indent_) return;
      block_scalar_ = false;
    }

    std::size_t pos = 0;
    if (flow_ == 0 && !plain_continues_) {
      if (blank) return;
      // Block context: maintain the stack of indentation columns.
      while (!columns_.empty() && columns_.back() >= indent)
        columns_.pop_back();
      columns_.push_back(indent);
      pos = indent;
      line_indent_ = static_cast<long>(indent);
      check(pos);
    }
    scan_tokens(line, pos);
  }

  // yaml-cpp reads a flow collection left open at the end of the text in surprising ways
  // ("mapping keys must be names" for `[0.9`); say what is wrong instead.
  void finish() const {
    if (flow_ > 0)
      throw DeckError(
          "", origin_.where(outer_line_, outer_col_),
          std::string("unclosed '") + outer_bracket_ + "' (a flow collection must be closed)");
  }

 private:
  int depth() const { return 2 * static_cast<int>(columns_.size()) + flow_; }

  void check(std::size_t col) const {
    if (depth() > max_depth_)
      throw DeckError("", origin_.where(line_no_, static_cast<long>(col)),
                      "the deck nests deeper than " + std::to_string(max_depth_) +
                          " levels (refused before parsing)");
  }

  void scan_tokens(std::string_view line, std::size_t pos) {
    bool in_plain = plain_continues_;
    plain_continues_ = false;
    bool after_space = true;  // a line break counts as white space before `#`
    for (std::size_t i = pos; i < line.size(); ++i) {
      const char c = line[i];
      if (c == ' ' || c == '\t') {
        after_space = true;
        continue;
      }
      if (c == '#' && after_space) return;  // a comment ends the line (and a plain scalar)
      after_space = false;
      if (in_plain) {
        const bool colon_ends =
            c == ':' && (is_blank_at(line, i + 1) || (flow_ > 0 && is_flow_indicator(line[i + 1])));
        const bool flow_ends = flow_ > 0 && (is_flow_indicator(c) || c == '?');
        // In block context YAML reads `[`/`{` inside a plain scalar as text; counting
        // them as structure only over-estimates.
        const bool opens = c == '[' || c == '{';
        if (!colon_ends && !flow_ends && !opens) continue;
        in_plain = false;
      }
      // A token starts here.
      if (c == '[' || c == '{') {
        if (flow_ == 0) {
          outer_line_ = line_no_;
          outer_col_ = static_cast<long>(i);
          outer_bracket_ = c;
        }
        ++flow_;
        check(i);
      } else if (c == ']' || c == '}') {
        if (flow_ > 0) --flow_;
      } else if (c == ',') {
      } else if (c == '"' || c == '\'') {
        i = skip_quoted(line, i);
      } else if ((c == '-' || c == '?' || c == ':') &&
                 (is_blank_at(line, i + 1) ||
                  (c == ':' && flow_ > 0 && is_flow_indicator(line[i + 1])))) {
        if (flow_ == 0) {
          // A block indicator may open a collection nested at this column, even in the
          // middle of a line (`- - - x`; yaml-cpp also accepts `a: - - x`).
          columns_.push_back(i + 1);
          check(i);
        }
      } else if (c == '&' || c == '*' || c == '!') {
        // Anchor, alias or tag: a name up to white space (or a flow indicator).
        while (i + 1 < line.size() && line[i + 1] != ' ' && line[i + 1] != '\t' &&
               !(flow_ > 0 && is_flow_indicator(line[i + 1])))
          ++i;
      } else if (flow_ == 0 && (c == '|' || c == '>')) {
        block_scalar_ = true;
        block_parent_indent_ = line_indent_;
        block_content_indent_ = -1;
        return;
      } else {
        in_plain = true;
      }
    }
    // A plain scalar inside a flow collection continues on the next line, where a
    // quote is text, not an opening quote.
    plain_continues_ = in_plain && flow_ > 0;
  }

  // Returns the index of the closing quote.
  std::size_t skip_quoted(std::string_view line, std::size_t open) const {
    const char q = line[open];
    for (std::size_t i = open + 1; i < line.size(); ++i) {
      if (q == '"' && line[i] == '\\') {
        ++i;
      } else if (line[i] == q) {
        if (q == '\'' && i + 1 < line.size() && line[i + 1] == '\'') {
          ++i;  // '' is an escaped single quote
        } else {
          return i;
        }
      }
    }
    throw DeckError("", origin_.where(line_no_, static_cast<long>(open)),
                    "a quoted string must end on the line it starts (decks do not support "
                    "multi-line quoted strings)");
  }

  const TextOrigin& origin_;
  int max_depth_;
  long line_no_ = 0;
  std::vector<std::size_t> columns_;
  int flow_ = 0;
  bool plain_continues_ = false;
  bool block_scalar_ = false;
  long block_parent_indent_ = 0;
  long block_content_indent_ = -1;
  long line_indent_ = 0;
  long outer_line_ = 0;
  long outer_col_ = 0;
  char outer_bracket_ = '[';
};

// ---------------------------------------------------------------------------------------
// Event handler building the tree
// ---------------------------------------------------------------------------------------

constexpr const char* kStrTag = "tag:yaml.org,2002:str";

class TreeBuilder : public YAML::EventHandler {
 public:
  explicit TreeBuilder(const TextOrigin& origin) : origin_(origin) {}

  bool has_root() const { return has_root_; }
  YamlNode take_root() { return std::move(root_); }
  const std::string& document_where() const { return document_where_; }

  void OnDocumentStart(const YAML::Mark& mark) override { document_where_ = where(mark); }
  void OnDocumentEnd() override {}

  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    check_anchor(mark, anchor);
    if (expecting_key())
      throw DeckError("", where(mark), "empty mapping key (every key must be a name)");
    YamlNode n;
    n.where = where(mark);
    add(std::move(n));
  }

  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override {
    // Refusing aliases also rules out "billion laughs" expansion.
    throw DeckError("", where(mark), "YAML aliases (*name) are not supported in decks");
  }

  void OnAnchor(const YAML::Mark& mark, const std::string& name) override {
    throw DeckError("", where(mark), "YAML anchors (&" + name + ") are not supported in decks");
  }

  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string& value) override {
    check_anchor(mark, anchor);
    YamlNode n;
    n.kind = YamlNode::Kind::Scalar;
    n.value = value;
    n.where = where(mark);
    // yaml-cpp reports "?" for plain scalars and "!" for quoted ones.
    if (tag == "?") {
      n.plain = true;
    } else if (tag != "!" && tag != kStrTag) {
      throw DeckError("", n.where, "explicit YAML tag '" + tag + "' is not supported in decks");
    }
    add(std::move(n));
  }

  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    start(mark, tag, anchor, YamlNode::Kind::Sequence);
  }
  void OnSequenceEnd() override { end(); }

  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    start(mark, tag, anchor, YamlNode::Kind::Map);
  }
  void OnMapEnd() override { end(); }

 private:
  struct Frame {
    YamlNode node;
    bool have_key = false;
    std::string key;
    std::string key_where;
  };

  std::string where(const YAML::Mark& mark) const { return origin_.where(mark.line, mark.column); }

  void check_anchor(const YAML::Mark& mark, YAML::anchor_t anchor) const {
    if (anchor != YAML::NullAnchor)
      throw DeckError("", where(mark), "YAML anchors (&name) are not supported in decks");
  }

  bool expecting_key() const {
    return !stack_.empty() && stack_.back().node.kind == YamlNode::Kind::Map &&
           !stack_.back().have_key;
  }

  void start(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
             YamlNode::Kind kind) {
    check_anchor(mark, anchor);
    if (tag != "?")
      throw DeckError("", where(mark), "explicit YAML tag '" + tag + "' is not supported in decks");
    if (expecting_key())
      throw DeckError("", where(mark), "mapping keys must be names, not collections");
    Frame f;
    f.node.kind = kind;
    f.node.where = where(mark);
    stack_.push_back(std::move(f));
  }

  void end() {
    YamlNode n = std::move(stack_.back().node);
    stack_.pop_back();
    add(std::move(n));
  }

  void add(YamlNode n) {
    if (stack_.empty()) {
      root_ = std::move(n);
      has_root_ = true;
      return;
    }
    Frame& f = stack_.back();
    if (f.node.kind == YamlNode::Kind::Sequence) {
      f.node.children.push_back(std::move(n));
      return;
    }
    if (!f.have_key) {
      if (const YamlNode* first = f.node.find(n.value); first != nullptr) {
        const auto k = static_cast<std::size_t>(first - f.node.children.data());
        throw DeckError(
            "", n.where,
            "duplicate key '" + n.value + "' (first given at " + f.node.key_wheres[k] + ")");
      }
      f.key = std::move(n.value);
      f.key_where = std::move(n.where);
      f.have_key = true;
      return;
    }
    f.node.keys.push_back(std::move(f.key));
    f.node.key_wheres.push_back(std::move(f.key_where));
    f.node.children.push_back(std::move(n));
    f.have_key = false;
  }

  const TextOrigin& origin_;
  std::vector<Frame> stack_;
  YamlNode root_;
  bool has_root_ = false;
  std::string document_where_;
};

}  // namespace

void prescan_yaml(std::string_view text, const TextOrigin& origin, std::size_t max_bytes,
                  int max_depth) {
  if (text.size() > max_bytes)
    throw DeckError("", origin.name,
                    "the deck is " + std::to_string(text.size()) +
                        " bytes, more than the limit of " + std::to_string(max_bytes) + " bytes");
  // Bytes first: yaml-cpp guesses UTF-16/32 from NUL bytes and would misread the text.
  long line = 0;
  std::size_t line_start = 0;
  for (std::size_t i = 0; i < text.size();) {
    const char c = text[i];
    const auto col = static_cast<long>(i - line_start);
    if (c == '\0') throw DeckError("", origin.where(line, col), "NUL byte in the deck");
    const std::size_t n = utf8_length(text, i);
    if (n == 0) {
      std::ostringstream os;
      os << "invalid UTF-8 (byte 0x" << std::hex
         << static_cast<unsigned>(static_cast<unsigned char>(c)) << ")";
      throw DeckError("", origin.where(line, col), os.str());
    }
    if (c == '\n') {
      ++line;
      line_start = i + 1;
    }
    i += n;
  }

  DepthScanner scanner(origin, max_depth);
  line = 0;
  for (std::size_t start = 0; start <= text.size(); ++line) {
    std::size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view l = text.substr(start, end - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    scanner.scan_line(l, line);
    start = end + 1;
  }
  scanner.finish();
}

YamlNode parse_yaml(std::string_view text, const TextOrigin& origin, std::size_t max_bytes,
                    int max_depth) {
  prescan_yaml(text, origin, max_bytes, max_depth);
  std::istringstream in{std::string(text)};
  try {
    YAML::Parser parser(in);
    TreeBuilder builder(origin);
    if (!parser.HandleNextDocument(builder) || !builder.has_root()) {
      YamlNode empty;
      empty.where = origin.where(0, 0);
      return empty;
    }
    YamlNode root = builder.take_root();
    TreeBuilder second(origin);
    if (parser.HandleNextDocument(second))
      throw DeckError("", second.document_where(),
                      "more than one YAML document (a deck is a single document)");
    return root;
  } catch (const YAML::Exception& e) {
    const long line0 = e.mark.is_null() ? -1 : e.mark.line;
    throw DeckError("", origin.where(line0, e.mark.column), "YAML syntax error: " + e.msg);
  }
}

}  // namespace dst::config::detail
