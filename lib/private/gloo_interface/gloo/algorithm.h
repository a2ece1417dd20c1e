// Stand-in for gloo/algorithm.h: c10d's ProcessGroupGloo.hpp needs nothing from it (README.md).
#pragma once
