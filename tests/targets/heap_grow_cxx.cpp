// C++ heap-profile control target: like heap_grow.c, but the allocating
// function is a static member of a class in a namespace and allocates with
// operator new[], so the profile's frames must come out demangled
// ("allocdiag_heapctl::Grower::grow_site(int, unsigned long)").
#include <cstdio>
#include <cstring>
#include <unistd.h>
#include <vector>

namespace allocdiag_heapctl {
struct Grower {
    static std::vector<char *> blocks;
    __attribute__((noinline)) static void grow_site(int n, size_t size) {
        for (int i = 0; i < n; i++) {
            char *p = new char[size];
            std::memset(p, 1, size);
            blocks.push_back(p);
        }
    }
};
std::vector<char *> Grower::blocks;
}  // namespace allocdiag_heapctl

int main() {
    char line[256];
    int n;
    size_t size;
    allocdiag_heapctl::Grower::blocks.reserve(100000);
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    std::printf("READY %d\n", (int)getpid());
    while (std::fgets(line, sizeof line, stdin)) {
        if (std::sscanf(line, "grow %d %zu", &n, &size) == 2) {
            allocdiag_heapctl::Grower::grow_site(n, size);
            std::printf("OK grow %zu\n", allocdiag_heapctl::Grower::blocks.size());
        } else {
            std::printf("ERR %s", line);
        }
    }
    return 0;
}
