// Package churn holds one test, run by the unit tests: `podres-proxy serve`,
// as a process, on a node whose pods change every 50 to 150 ms (admitted,
// started through NRI, deleted, force-deleted, recreated under their name
// with another device while the old sandbox runs on) under 8 polling
// clients, killed with SIGKILL halfway and started again on its state
// directory; every answer is checked against what the node held while it
// was asked. Once with serve reading /pods, once with it watching the Pods
// API. The node is the fake kubelet (test/fakekubelet, podsapitest) and
// nri's own runtime adaptation.
//
//	go test -race -count=1 ./test/churn/                          # 15 s each
//	PODRES_CHURN=10m go test -count=1 -timeout 30m -v ./test/churn/
//	PODRES_CHURN_SEED=N ...                                       # replay a run's node
package churn
