// Command passthrough is the benchmark report's floor in an executable of
// its own: a raw gRPC pass-through that forwards every unary call on
// --socket to the PodResources socket --upstream as bytes, decoding
// nothing, the least any proxy on that path can do. It is a small program
// of its own, as the pass-through of listbench is, so that it runs
// from a file whose code the report's process (its clients and fake
// kubelets) has not just run, as podres-proxy does (docs/performance.md,
// "Two floors").
//
// It prints "podres-bench-ready" once it serves and serves until its
// standard input closes, as the report's other proxy processes do.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// maxMessage bounds answers, as clients of the kubelet conventionally do.
const maxMessage = 16 << 20

// frame is a message kept as its wire bytes.
type frame struct{ b []byte }

// rawCodec moves messages as bytes, so that no answer is decoded.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.(*frame).b, nil }

func (rawCodec) Unmarshal(b []byte, v any) error {
	v.(*frame).b = append([]byte(nil), b...)
	return nil
}

func (rawCodec) Name() string { return "raw" }

func main() {
	socket := flag.String("socket", "", "the unix socket to serve")
	upstream := flag.String("upstream", "", "the PodResources socket to forward to")
	flag.Parse()
	if *socket == "" || *upstream == "" {
		fmt.Fprintln(os.Stderr, "usage: passthrough --socket PATH --upstream PATH")
		os.Exit(2)
	}
	if err := run(*socket, *upstream); err != nil {
		fmt.Fprintln(os.Stderr, "passthrough:", err)
		os.Exit(1)
	}
}

func run(socket, upstream string) error {
	up, err := grpc.NewClient("unix://"+upstream,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(maxMessage)))
	if err != nil {
		return fmt.Errorf("upstream %s: %w", upstream, err)
	}
	defer up.Close()
	l, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
		method, _ := grpc.MethodFromServerStream(ss)
		in := &frame{}
		if err := ss.RecvMsg(in); err != nil {
			return err
		}
		md, _ := metadata.FromIncomingContext(ss.Context())
		out := &frame{}
		if err := up.Invoke(metadata.NewOutgoingContext(ss.Context(), md), method, in, out); err != nil {
			return err
		}
		return ss.SendMsg(out)
	}))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Println("podres-bench-ready")
	stdinClosed := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdinClosed)
	}()
	select {
	case <-stdinClosed:
		srv.Stop()
		<-served
		return nil
	case err := <-served:
		return err
	}
}
