package plugin

// Synced reports whether the runtime's Synchronize has been applied to the
// store on the current connection.
func (p *Plugin) Synced() bool {
	p.handlers.mu.Lock()
	defer p.handlers.mu.Unlock()
	return p.handlers.synced
}
