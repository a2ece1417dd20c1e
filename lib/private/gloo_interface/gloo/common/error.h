// Stand-in for gloo/common/error.h: c10d's ProcessGroupGloo.hpp needs nothing from it (README.md).
#pragma once
