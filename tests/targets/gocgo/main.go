// cgo target: its C side mallocs (through whatever malloc the process
// binds: glibc, or a preloaded one) and its Go side allocates on the Go
// heap; prints READY, then answers each line read on stdin with
// "ECHO <line>" and exits 0 when stdin closes.  Its Ms park in the Go
// runtime's own waits (runtime.futex notes, sysmon); the main goroutine's
// read runs on a goroutine stack.  Modes (argv[1]):
//   timer   a goroutine sleeps for an hour: an idle M waits in the
//           netpoller (epoll_pwait with a timeout)
//   signal  os/signal's receiver goroutine parks in runtime.futex on its
//           goroutine stack (runtime/sigqueue.go signal_recv: notetsleepg)
//   locked  the main goroutine is locked to the main thread and waits on a
//           channel while another goroutine reads stdin: the main thread
//           parks in runtime.futex on the main [stack] (runtime/proc.go
//           stoplockedm -> mPark -> notesleep on g0)
package main

/*
#include <stdlib.h>
#include <string.h>
static char *keep[64];
static void c_alloc(void) {
	for (int i = 0; i < 64; i++) { keep[i] = malloc(64 << 10); memset(keep[i], 1, 64 << 10); }
}
*/
import "C"

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

var goKeep [][]byte

func init() {
	if len(os.Args) > 1 && os.Args[1] == "locked" {
		runtime.LockOSThread()
	}
}

func echo(done chan struct{}) {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fmt.Printf("ECHO %s\n", in.Text())
	}
	close(done)
}

func main() {
	C.c_alloc()
	for i := 0; i < 64; i++ {
		goKeep = append(goKeep, make([]byte, 64<<10))
	}
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "timer":
		go func() {
			for {
				time.Sleep(time.Hour)
			}
		}()
	case "signal":
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, syscall.SIGUSR1)
		go func() {
			for range ch {
			}
		}()
	}
	// the start-up allocations' GC cycle ends here, not during a test (a
	// cycle wakes sysmon out of its idle note into short usleeps)
	runtime.GC()
	fmt.Printf("READY %d\n", os.Getpid())
	done := make(chan struct{})
	if mode == "locked" {
		go echo(done)
		<-done
		return
	}
	echo(done)
}
