//go:build !race

package handover

// raceEnabled: the test runs without the race detector, and so does serve.
const raceEnabled = false
