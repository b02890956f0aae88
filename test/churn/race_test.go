//go:build race

package churn

// raceEnabled: the test runs with the race detector, and so does serve.
const raceEnabled = true
