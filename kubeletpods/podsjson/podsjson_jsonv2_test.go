//go:build goexperiment.jsonv2

package podsjson

import jsonv2 "encoding/json/v2"

// With GOEXPERIMENT=jsonv2 the benchmark also measures encoding/json/v2
// (and encoding/json then runs on the v2 implementation). Go 1.26 has v2
// only behind the experiment, which production builds do not set.
func init() {
	benchDecoders = append(benchDecoders, benchDecoder{"encoding-json-v2", func(b []byte) (int, error) {
		var l podList
		err := jsonv2.Unmarshal(b, &l)
		return len(l.Items), err
	}})
}
