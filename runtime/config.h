// Moved to the public headers (include/braid/config.h); this path stays for the
// code inside the tree.
#pragma once

#include "braid/config.h"
