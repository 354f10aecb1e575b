// Prints the generated key reference of docs/deck.md. After changing the schema
// (lib/config/schema.hpp), paste its output over the generated block of docs/deck.md;
// config_tests fails until the two agree.
#include <iostream>

#include "config/deck.hpp"

int main() {
  std::cout << dst::config::deck_reference_markdown();
  return 0;
}
