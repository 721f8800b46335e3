package clm_test

import (
	"fmt"

	clm "clmcache.example/clm"
)

// Two turns of one conversation: the second reuses the first's whole pages.
func Example() {
	opts, err := clm.DefaultEngineOptions()
	if err != nil {
		panic(err)
	}
	opts.NumPages = 1024
	engine, err := clm.NewEngine(opts)
	if err != nil {
		panic(err)
	}
	defer engine.Close()

	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	seq, err := engine.Admit(prompt, &clm.AdmitOptions{CacheSalt: "tenant-7"})
	if err != nil {
		panic(err)
	}
	slots, _ := seq.Slots() // the host writes the K/V of all 20 tokens here
	for _, next := range []int32{21, 22, 23} {
		_ = seq.Extend([]int32{next}) // one decode step
	}
	if err := seq.Finish(); err != nil {
		panic(err)
	}
	seq.Close()

	turn2 := append(append([]int32{}, prompt...), 21, 22, 23, 24, 25)
	seq, err = engine.Admit(turn2, &clm.AdmitOptions{CacheSalt: "tenant-7"})
	if err != nil {
		panic(err)
	}
	defer seq.Close()
	cached, _ := seq.CachedTokens()
	fmt.Println(len(slots), "slots in turn 1;", cached, "of", len(turn2), "tokens cached in turn 2")

	_ = seq.Finish()
	err = seq.Finish() // a second finish is refused
	fmt.Println(clm.CodeOf(err).String())
	// Output:
	// 20 slots in turn 1; 16 of 25 tokens cached in turn 2
	// failed_precondition
}
