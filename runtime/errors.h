// Moved to the public headers (include/braid/errors.h); this path stays for the
// code inside the tree.
#pragma once

#include "braid/errors.h"
