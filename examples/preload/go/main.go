// A tiny Go program for preload_mistakes.py's "go" scenario: its memory lives
// on the Go heap (runtime mmap'd arenas), not in any malloc; built with
// CGO_ENABLED=0 it is statically linked, so LD_PRELOAD is never even read.
//
// Prints: READY scenario=go heap_alloc=B heap_sys=B heap_idle=B heap_released=B
// then idles until SIGTERM/SIGINT (exit 0).
package main

import (
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

var keep [][]byte

func main() {
	mib := 64
	for i := 0; i < mib*16; i++ { // 64 KiB blocks
		b := make([]byte, 64<<10)
		for j := range b {
			b[j] = byte(i)
		}
		keep = append(keep, b)
	}
	half := len(keep) / 2
	for i := half; i < len(keep); i++ {
		keep[i] = nil // drop half: the Go GC frees it
	}
	keep = keep[:half]
	runtime.GC()

	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	fmt.Printf("READY scenario=go heap_alloc=%d heap_sys=%d heap_idle=%d heap_released=%d preload=%s\n",
		m.HeapAlloc, m.HeapSys, m.HeapIdle, m.HeapReleased, orDash(os.Getenv("LD_PRELOAD")))

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	os.Exit(0)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
