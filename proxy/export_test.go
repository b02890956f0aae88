package proxy

// OnSharedCallJoin calls f each time a caller of List (v1 and v1alpha1) or
// GetAllocatableResources starts waiting for a shared kubelet call, so that
// tests can await callers instead of sleeping.
func OnSharedCallJoin(s *Server, f func(method string)) {
	for _, c := range []interface{ SetJoined(func(string)) }{s.listV1, s.listV1alpha1, s.allocatable} {
		c.SetJoined(f)
	}
}
