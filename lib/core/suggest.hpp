#pragma once
// "Did you mean ...?" for a misspelt name: the closest of the known names.

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dst::core {

/// Optimal string alignment distance: Levenshtein plus adjacent transpositions, the most
/// common typo ("max_stpes").
std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate nearest `word` within a third of its length in edits (1 to 3): close
/// enough to be a plausible typo ("--forc" -> "--force"), not a different word ("--foo"
/// -> "--top-p"). The first of equally near ones; none when none is near enough.
std::optional<std::string> closest(std::string_view word,
                                   const std::vector<std::string>& candidates);

}  // namespace dst::core
