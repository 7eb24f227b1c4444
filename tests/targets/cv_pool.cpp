// A std::condition_variable thread pool: N workers park in cv.wait()
// (futex FUTEX_WAIT_BITSET), the main thread feeds a small malloc/free job
// for each line read from stdin ("job COUNT"), prints "done TOTAL".
// Usage: cv_pool WORKERS ; prints "READY" when every worker is parked.
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <atomic>
#include <iostream>

static std::mutex mu;
static std::condition_variable cv, done_cv;
static std::deque<int> jobs;
static std::atomic<long> finished{0};
static std::atomic<int> parked{0};

static void worker() {
    for (;;) {
        int n;
        {
            std::unique_lock<std::mutex> lk(mu);
            parked++;
            cv.wait(lk, [] { return !jobs.empty(); });
            parked--;
            n = jobs.front();
            jobs.pop_front();
        }
        std::vector<std::string> v;
        for (int i = 0; i < n; i++) v.emplace_back(16 + (i * 37) % 4000, 'x');
        {
            std::lock_guard<std::mutex> lk(mu);   // no lost wakeup of the feeder
            finished++;
        }
        done_cv.notify_all();
    }
}

int main(int argc, char **argv) {
    int workers = argc > 1 ? atoi(argv[1]) : 4;
    std::vector<std::thread> ts;
    for (int i = 0; i < workers; i++) ts.emplace_back(worker);
    while (parked.load() < workers) std::this_thread::yield();
    std::printf("READY workers=%d\n", workers);
    std::fflush(stdout);
    std::string line;
    while (std::getline(std::cin, line)) {
        int count = 0, size = 0;
        if (std::sscanf(line.c_str(), "job %d %d", &count, &size) < 1) continue;
        if (size <= 0) size = 200;
        long target = finished.load() + count;
        {
            std::lock_guard<std::mutex> lk(mu);
            for (int i = 0; i < count; i++) jobs.push_back(size);
        }
        cv.notify_all();
        std::unique_lock<std::mutex> lk(mu);
        done_cv.wait(lk, [&] { return finished.load() >= target; });
        std::printf("done %ld\n", finished.load());
        std::fflush(stdout);
    }
    std::_Exit(0);
}
