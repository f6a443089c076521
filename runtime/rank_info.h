// Moved to the public headers (include/braid/rank_info.h); this path stays for the
// code inside the tree.
#pragma once

#include "braid/rank_info.h"
