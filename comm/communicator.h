// Moved to the public headers (include/braid/communicator.h); this path
// stays for the code inside the tree, which also sees the private Op.
#pragma once

#include "braid/communicator.h"
#include "comm/types.h"
