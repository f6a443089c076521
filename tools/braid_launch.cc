// Placeholder until braid-launch lands.
#include <cstdio>
int main() { std::fprintf(stderr, "braid-launch: not built yet\n"); return 1; }
