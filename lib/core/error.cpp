#include "core/error.hpp"

namespace dst {

namespace {
std::string deck_message(const std::string& key, const std::string& where,
                         const std::string& message) {
  std::string out = where.empty() ? std::string() : where + ": ";
  if (!key.empty()) out += key + ": ";
  return out + message;
}
}  // namespace

DeckError::DeckError(std::string key, std::string where, const std::string& message)
    : Error(deck_message(key, where, message)), key_(std::move(key)), where_(std::move(where)) {}

}  // namespace dst
