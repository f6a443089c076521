// Moved to the public headers (include/braid/dtype.h); this path stays for the
// code inside the tree.
#pragma once

#include "braid/dtype.h"
