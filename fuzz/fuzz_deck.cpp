/// \file fuzz_deck.cpp
/// libFuzzer target: run decks through what `dstrain check` runs (docs/fuzzing.md).
///
/// Input: the deck text, optionally followed by a NUL byte and `--set` overrides, one per
/// line ("training.max_steps=10"). Decks themselves refuse NUL bytes (a unit test covers
/// that), so the split loses nothing.
///
/// Properties checked, each a crash when violated:
/// - load_deck_text, parse_override and resolve_layout end normally or throw DeckError
///   (resolve_layout's documented dst::Error for a world size < 1 is never asked for);
///   any other exception escapes and libFuzzer reports it as a crash;
/// - an accepted deck round-trips: load_deck_text(to_yaml(c)) == c (deck.hpp);
/// - ASan/UBSan/LSan: no memory error, undefined behaviour or leak; -timeout: no hang.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "config/deck.hpp"
#include "core/error.hpp"

namespace {

[[noreturn]] void property_failed(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_deck: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// World sizes `dstrain check` meets: one rank, small nodes, odd counts, a large job.
constexpr int kWorldSizes[] = {1, 2, 3, 4, 6, 8, 64, 1000, 65536};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t nul = input.find('\0');
  const std::string_view deck = input.substr(0, nul);

  std::vector<dst::config::Override> overrides;
  if (nul != std::string_view::npos) {
    std::string_view rest = input.substr(nul + 1);
    while (!rest.empty() && overrides.size() < 8) {
      const std::size_t nl = rest.find('\n');
      const std::string_view line = rest.substr(0, nl);
      rest = nl == std::string_view::npos ? std::string_view{} : rest.substr(nl + 1);
      try {
        overrides.push_back(dst::config::parse_override(line));
      } catch (const dst::DeckError&) {
        return 0;  // `dstrain check` stops at a malformed --set as well
      }
    }
  }

  dst::config::RunConfig config;
  try {
    config = dst::config::load_deck_text(deck, "fuzz.yaml", overrides);
  } catch (const dst::DeckError& e) {
    if (std::getenv("DSTRAIN_FUZZ_VERBOSE") != nullptr)
      std::fprintf(stderr, "refused: %s\n", e.what());
    return 0;
  }

  (void)dst::config::advisories(config);
  for (int world : kWorldSizes) {
    try {
      const dst::config::Layout layout = dst::config::resolve_layout(config, world);
      if (layout.world_size != world ||
          static_cast<long long>(layout.data) * layout.tensor * layout.pipeline != world)
        property_failed("resolve_layout: data x tensor x pipeline != world size",
                        dst::config::to_yaml(config));
    } catch (const dst::DeckError&) {
    }
  }

  const std::string yaml = dst::config::to_yaml(config);
  dst::config::RunConfig again;
  try {
    again = dst::config::load_deck_text(yaml, "resolved.yaml");
  } catch (const dst::DeckError& e) {
    property_failed("the resolved deck (to_yaml) does not load back", e.what() + ("\n" + yaml));
  }
  if (again != config)
    property_failed("load_deck_text(to_yaml(c)) != c",
                    yaml + "\n--- reloaded ---\n" + dst::config::to_yaml(again));
  return 0;
}
