// Idle Go target: allocates on the Go heap, prints READY, then blocks.
package main

import (
	"fmt"
	"os"
)

var keep [][]byte

func main() {
	for i := 0; i < 64; i++ {
		keep = append(keep, make([]byte, 64<<10))
	}
	fmt.Printf("READY %d\n", os.Getpid())
	buf := make([]byte, 16)
	for {
		if _, err := os.Stdin.Read(buf); err != nil {
			return
		}
	}
}
