package state

import (
	"github.com/podres-proxy/podres-proxy/state/persist"
	"github.com/podres-proxy/podres-proxy/state/record"
)

// A Record and its parts are package state/record's, with the file format
// they share with state/persist; the store's callers find them here.
type (
	Record     = record.Record
	Phase      = record.Phase
	Origin     = record.Origin
	Seen       = record.Seen
	Provenance = record.Provenance
	Container  = record.Container
)

const (
	SchemaVersion = record.SchemaVersion
	PhasePending  = record.PhasePending
	PhaseReady    = record.PhaseReady
	PhaseStopped  = record.PhaseStopped
	PhaseRemoved  = record.PhaseRemoved
	OriginKubelet = record.OriginKubelet
	OriginNRI     = record.OriginNRI
	OriginCRI     = record.OriginCRI
)

// SortRecords sorts records by namespace, name and UID.
func SortRecords(rs []*Record) { record.Sort(rs) }

// FileError is a record file that ReadDir could not read or decode.
type FileError = persist.FileError

// ReadDir reads the records of a state directory without taking its lock,
// for readers such as `podres-proxy inspect` (see persist.ReadDir).
func ReadDir(dir string) ([]*Record, []error) { return persist.ReadDir(dir) }
