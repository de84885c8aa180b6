package limitertest

import "slices"

// Median is the middle of xs (the upper one of an even count), 0 for none:
// what the benchmarks report of their rounds.
func Median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
