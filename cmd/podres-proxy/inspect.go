package main

import (
	"context"
	"errors"
	"io"
)

// runInspect is a placeholder until the command lands.
func runInspect(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("not implemented yet")
}
