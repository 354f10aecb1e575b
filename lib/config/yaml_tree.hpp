#pragma once
/// \file yaml_tree.hpp
/// A small, located YAML document tree built from yaml-cpp's event parser, and the
/// pre-scan that keeps hostile text away from yaml-cpp. Internal to dst_config.
///
/// Why not YAML::Node: the deck needs every node's line/column (for messages), whether a
/// scalar was quoted (`"10"` is a string, `10` an integer under the YAML 1.2 core
/// schema), duplicate-key detection and a refusal of anchors/aliases; the event API gives
/// all of that, YAML::Node none of it.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace dst::config::detail {

/// One YAML node with the place it came from.
struct YamlNode {
  enum class Kind { Null, Scalar, Sequence, Map };
  Kind kind = Kind::Null;
  std::string value;   ///< Scalar: the text
  bool plain = false;  ///< Scalar: unquoted and untagged (subject to core-schema resolution)
  std::string where;   ///< "deck.yaml:3:5" or "--set a.b=c"
  /// Map: keys (in document order), with where each key was written.
  std::vector<std::string> keys;
  std::vector<std::string> key_wheres;
  /// Map: the value of keys[i]; Sequence: the items.
  std::vector<YamlNode> children;

  /// Map lookup; nullptr when absent.
  const YamlNode* find(std::string_view key) const;
  YamlNode* find(std::string_view key);
};

/// How a text's locations are written in messages.
struct TextOrigin {
  std::string name;          ///< file name, used as "name:line:col"
  bool fixed_where = false;  ///< every location is `name` itself (an override)
  std::string where(long line0, long col0) const;  ///< 0-based in, 1-based out
};

/// Refuses text that is too large, contains NUL bytes or invalid UTF-8, or nests deeper
/// than `max_depth`, before any YAML parser sees it. Throws DeckError.
void prescan_yaml(std::string_view text, const TextOrigin& origin, std::size_t max_bytes,
                  int max_depth);

/// Pre-scans and parses exactly one YAML document. Empty text (or only comments) gives a
/// Null node. Throws DeckError for syntax errors (with location), several documents,
/// anchors/aliases, explicit tags other than !!str, non-scalar or duplicate map keys.
YamlNode parse_yaml(std::string_view text, const TextOrigin& origin, std::size_t max_bytes,
                    int max_depth);

/// Human-readable kind for messages: "a mapping", "a list", "null", "'abc'".
std::string describe(const YamlNode& node);

}  // namespace dst::config::detail
