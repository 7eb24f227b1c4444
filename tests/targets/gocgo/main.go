// cgo target: its C side mallocs (through whatever malloc the process
// binds: glibc, or a preloaded one) and its Go side allocates on the Go
// heap; prints READY, then blocks reading stdin.
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
	"fmt"
	"os"
)

var goKeep [][]byte

func main() {
	C.c_alloc()
	for i := 0; i < 64; i++ {
		goKeep = append(goKeep, make([]byte, 64<<10))
	}
	fmt.Printf("READY %d\n", os.Getpid())
	buf := make([]byte, 16)
	for {
		if _, err := os.Stdin.Read(buf); err != nil {
			return
		}
	}
}
