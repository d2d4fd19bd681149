.PHONY: run test bench
run:    ## web + worker + scheduler on this machine
	scripts/run
test:   ## the whole test suite
	scripts/test
bench:  ## the benchmarks; writes bench/REPORT.md and plots
	scripts/bench
