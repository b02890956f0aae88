//go:build !race

package churn

// raceEnabled: the test runs without the race detector, and so does serve.
const raceEnabled = false
