// C++ symbolizer target: allocations made by allocdiag_sym::Arena::grow
// (operator new), a profile dumped to argv[1], then READY and wait.
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "sym_dump.h"

namespace allocdiag_sym {

class Arena {
  public:
    __attribute__((noinline)) void grow(int n, std::size_t size) {
        for (int i = 0; i < n; i++) {
            char *p = new char[size];
            p[0] = 1;
            blocks_.push_back(p);
        }
    }

  private:
    std::vector<char *> blocks_;
};

}  // namespace allocdiag_sym

int main(int argc, char **argv) {
    static allocdiag_sym::Arena arena;
    sym_profile_start(argc > 2 ? argv[2] : "/tmp/sym_cpp");
    arena.grow(64, 4096);
    int rc = argc > 1 ? sym_profile_dump(argv[1]) : -1;
    std::printf("READY %d\n", rc);
    std::fflush(stdout);
    pause();
    return 0;
}
