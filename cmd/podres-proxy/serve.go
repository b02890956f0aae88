package main

import (
	"context"
	"errors"
	"io"
)

// runServe is a placeholder until the command lands.
func runServe(_ context.Context, _ []string, _, _ io.Writer) error {
	return errors.New("not implemented yet")
}
