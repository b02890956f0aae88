package limits

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/podres-proxy/podres-proxy/metrics"
)

// sharedOnly is a handler that, as the proxy's do, refuses a call with an
// Overdraft when no kubelet call made for others can answer it (here:
// never).
func sharedOnly(ctx context.Context, _ any) (any, error) {
	if OverdraftOf(ctx) != nil {
		return nil, ErrRateLimited()
	}
	return nil, nil
}

func fromProcess(pid int32) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{
		Addr:     &net.UnixAddr{Net: "unix"},
		AuthInfo: peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}, pid: pid, ok: true},
	})
}

func TestOneClientsFloodDoesNotStarveAnother(t *testing.T) {
	clock := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	limit := RateLimit(DefaultRateLimitQPS, DefaultRateLimitBurst, clock)
	ok := sharedOnly
	call := func(ctx context.Context) bool {
		_, err := limit(ctx, nil, &grpc.UnaryServerInfo{}, ok)
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("unexpected error %v", err)
		}
		return err == nil
	}
	flooder, polite := fromProcess(100), fromProcess(200)
	var allowed, politeOK, politeCalls int
	// Ten seconds in 10 ms steps: the flooder calls 20 times a step (2,000
	// a second), a Multus-like client once every 100 ms.
	for step := range 1000 {
		for range 20 {
			if call(flooder) {
				allowed++
			}
		}
		if step%10 == 0 {
			politeCalls++
			if call(polite) {
				allowed++
				politeOK++
			}
		}
		clock.Step(10 * time.Millisecond)
	}
	if rate := float64(politeOK) / float64(politeCalls); rate < 0.99 {
		t.Errorf("the polite client succeeded in %.1f%% of its %d calls while another flooded, want >= 99%%", 100*rate, politeCalls)
	}
	// Never more than the kubelet's own limit: 100/s for 10 s, plus the burst.
	if max := DefaultRateLimitQPS*10 + DefaultRateLimitBurst; allowed > max {
		t.Errorf("%d calls let through in 10 s, more than the kubelet's limit allows (%d)", allowed, max)
	}
}

func TestALoneClientGetsTheKubeletsRateAfterShortLivedClientsCameBy(t *testing.T) {
	// Twenty one-call clients (a Kata shim per new pod, a CLI) were active a
	// moment ago; now one client calls 90 times a second, under the
	// kubelet's 100/s. The kubelet would refuse none of its calls, and with
	// nobody else calling, the proxy must not either.
	clock := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	limit := RateLimit(DefaultRateLimitQPS, DefaultRateLimitBurst, clock)
	ok := sharedOnly
	for pid := range int32(20) {
		if _, err := limit(fromProcess(1000+pid), nil, &grpc.UnaryServerInfo{}, ok); err != nil {
			t.Fatalf("a one-call client was refused: %v", err)
		}
		clock.Step(5 * time.Millisecond)
	}
	clock.Step(time.Second) // the shared bucket is full again
	lone := fromProcess(42)
	refused := 0
	for range 270 { // three seconds at 90/s
		if _, err := limit(lone, nil, &grpc.UnaryServerInfo{}, ok); err != nil {
			refused++
		}
		clock.Step(time.Second / 90)
	}
	if refused != 0 {
		t.Errorf("%d of 270 calls at 90/s refused; the kubelet's limit (100/s) refuses none", refused)
	}
}

func TestALoneClientInBurstsIsNeverRefusedWhereTheKubeletWouldAllow(t *testing.T) {
	// The e2e suite's process calls in bursts (a List, a Get per pod, a
	// v1alpha1 List) while other clients came by seconds ago. Calling alone,
	// it must never be refused where the kubelet's own limiter allows.
	clock := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	limit := RateLimit(DefaultRateLimitQPS, DefaultRateLimitBurst, clock)
	kubelet := rate.NewLimiter(DefaultRateLimitQPS, DefaultRateLimitBurst)
	ok := sharedOnly
	for pid := range int32(5) { // short-lived clients, a few seconds ago
		if _, err := limit(fromProcess(1000+pid), nil, &grpc.UnaryServerInfo{}, ok); err != nil {
			t.Fatal(err)
		}
	}
	kubelet.AllowN(clock.Now(), 5)
	clock.Step(2 * time.Second)
	lone := fromProcess(42)
	for burst := range 20 {
		for call := range 4 + burst%9 { // 4 to 12 calls at once
			kubeletAllows := kubelet.AllowN(clock.Now(), 1)
			_, err := limit(lone, nil, &grpc.UnaryServerInfo{}, ok)
			if kubeletAllows && err != nil {
				t.Fatalf("burst %d, call %d: refused (%v) where the kubelet allows", burst, call, err)
			}
		}
		clock.Step(time.Duration(20+burst*7%60) * time.Millisecond)
	}
}

func TestPeerCredentialsNameTheCallingProcess(t *testing.T) {
	dir, err := os.MkdirTemp("", "prp-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	keys := make(chan string, 1)
	srv := grpc.NewServer(grpc.Creds(peerCredentials{}), grpc.UnaryInterceptor(
		func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			keys <- clientKey(ctx)
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	m := metrics.New(prometheus.NewRegistry())
	go srv.Serve(NewListener(l, 4, 4, NewUnread(0, m), m))
	defer srv.Stop()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	want := peerCred{uid: int32(os.Getuid()), pid: int32(os.Getpid()), ok: true}.key()
	if got := <-keys; got != want {
		t.Fatalf("client key %q, want %q", got, want)
	}
}

// A call the limit refuses reaches its handler with an Overdraft, to be
// answered only from a kubelet call others make (or refused there).
func TestARefusedCallReachesItsHandlerWithAnOverdraft(t *testing.T) {
	clock := testingclock.NewFakeClock(time.Unix(1_700_000_000, 0))
	limit := RateLimit(DefaultRateLimitQPS, 1, clock)
	var over *Overdraft
	h := func(ctx context.Context, _ any) (any, error) { over = OverdraftOf(ctx); return nil, nil }
	if _, err := limit(fromProcess(1), nil, &grpc.UnaryServerInfo{}, h); err != nil || over != nil {
		t.Fatalf("a call within the limit: err %v, overdraft %v", err, over)
	}
	if _, err := limit(fromProcess(1), nil, &grpc.UnaryServerInfo{}, h); err != nil || over == nil {
		t.Fatalf("a refused call: err %v, overdraft %v, want its handler with an Overdraft", err, over)
	}
	// The tokens it may take come back every 10 ms at 100/s; it waits
	// for no more than 50 ms.
	var cancel func()
	for i := 1; i <= 5; i++ {
		delay, c, ok := over.Reserve()
		if !ok || delay != time.Duration(i)*10*time.Millisecond {
			t.Fatalf("Reserve %d = %v, %v, want a token %d ms away", i, delay, ok, i*10)
		}
		cancel = c
	}
	if _, _, ok := over.Reserve(); ok {
		t.Error("a token more than 50 ms away was reserved")
	}
	cancel()
	if _, _, ok := over.Reserve(); !ok {
		t.Error("the token given back cannot be reserved again")
	}
}
