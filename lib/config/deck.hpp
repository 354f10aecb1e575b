#pragma once
/// \file deck.hpp
/// Reading, validating, overriding and echoing run decks (docs/deck.md).
///
/// Every error is a dst::DeckError whose message names the key path and where it came
/// from: "deck.yaml:12:5: training.max_stpes: unknown key (did you mean
/// 'training.max_steps'?)" or "--set training.max_steps=abc: training.max_steps:
/// expected an integer, got 'abc'".

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "config/run_config.hpp"

namespace dst::config {

/// Decks larger than this are refused before parsing (a deck is a page of YAML).
inline constexpr std::size_t kMaxDeckBytes = 1u << 20;
/// Nesting deeper than this is refused before yaml-cpp sees the text (yaml-cpp parses
/// recursively and a deeply nested document can exhaust the stack).
inline constexpr int kMaxDeckDepth = 32;

/// One command-line override, `--set path=value`.
struct Override {
  std::string path;   ///< "training.max_steps"
  std::string value;  ///< "10" (YAML scalar or flow sequence text: "[0.9, 0.95]")
  std::string text;   ///< the original "training.max_steps=10", for messages
};

/// Parses "path=value"; throws DeckError if there is no '=' or the path is empty.
Override parse_override(std::string_view text);

/// Parses, applies overrides, resolves the model preset, validates. `source_name` is
/// used in messages (normally the file path).
RunConfig load_deck_text(std::string_view text, std::string_view source_name,
                         const std::vector<Override>& overrides = {});

/// Reads the file (refusing ones larger than kMaxDeckBytes) and calls load_deck_text.
RunConfig load_deck_file(const std::string& path, const std::vector<Override>& overrides = {});

/// Reads a deck file's text with the size limit; throws DeckError naming the file.
std::string read_deck_file(const std::string& path);

/// Checks every range and combination rule of the schema on a config built in code
/// (load_deck_text already does this). Throws DeckError naming the keys; the location
/// is empty.
void validate(const RunConfig& config);

/// The model section a preset gives (model.preset set to `name`); throws DeckError
/// listing the presets for an unknown name.
ModelSection preset_model(const std::string& name);

/// Checks the combinations that depend on the world size (parallel.data equal to it, the
/// global batch dividing into micro-batches x data ranks) and returns the layout, whose
/// tensor and pipeline are 1 (validate refuses more). Throws DeckError naming the keys.
Layout resolve_layout(const RunConfig& config, int world_size);

/// Legal but suspicious settings, one sentence each (printed as warnings by rank 0).
std::vector<std::string> advisories(const RunConfig& config);

/// The resolved deck as YAML; load_deck_text(to_yaml(c)) == c.
std::string to_yaml(const RunConfig& config);

/// One key whose value differs between two configs (values as YAML text).
struct KeyChange {
  std::string path;  ///< "model.d_model"
  std::string from;  ///< "256"
  std::string to;    ///< "128"
};

/// The keys whose values differ between `from` and `to`, in document order.
std::vector<KeyChange> differences(const RunConfig& from, const RunConfig& to);

/// Names of the model presets.
std::vector<std::string> preset_names();

/// One documented deck key, as the schema knows it.
struct KeyInfo {
  std::string path;           ///< "training.optimizer.lr"
  std::string type;           ///< "integer", "number", "boolean", "string", "enum", ...
  std::string default_value;  ///< YAML text of the default
  std::string allowed;        ///< range or allowed values, human-readable
  std::string doc;            ///< one-sentence description
};

/// Every key of the schema, in document order.
std::vector<KeyInfo> schema_keys();

/// The key reference of docs/deck.md, generated from the schema (the test compares the
/// committed docs/deck.md with it).
std::string deck_reference_markdown();

}  // namespace dst::config
