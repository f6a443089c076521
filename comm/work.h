// Moved to the public headers (include/braid/work.h); this path stays for the
// code inside the tree.
#pragma once

#include "braid/work.h"
