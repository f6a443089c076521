// Placeholder until braid-bench lands.
#include <cstdio>
int main() { std::fprintf(stderr, "braid-bench: not built yet\n"); return 1; }
