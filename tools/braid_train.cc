// Placeholder until braid-train lands.
#include <cstdio>
int main() { std::fprintf(stderr, "braid-train: not built yet\n"); return 1; }
