//go:build race

package handover

// raceEnabled: the test runs with the race detector, and so does serve.
const raceEnabled = true
