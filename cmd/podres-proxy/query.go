package main

import (
	"context"
	"errors"
	"io"
)

// runQuery is a placeholder until the command lands.
func runQuery(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("not implemented yet")
}
