#pragma once
// An allowed include: dst_high links dst_low.
#include "low/low.hpp"
