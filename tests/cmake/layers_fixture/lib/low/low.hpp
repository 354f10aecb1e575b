#pragma once
// The upward include layers_allowed_includes_catches_upward expects to be reported.
#include <vector>

#include "high/high.hpp"
