// Command scrapeprobe is the cluster suite's scraper in a pod: it GETs one
// URL over HTTPS, as Prometheus scrapes, with the bearer token of the
// pod's service account (or none), and prints one line on stdout: the HTTP
// status, or the error. The suite reads it back from the pod's log.
//
// Usage: scrapeprobe --url URL [--token-file PATH] [--insecure-skip-verify]
package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

func main() {
	url := pflag.String("url", "", "the URL to GET")
	tokenFile := pflag.String("token-file", "/var/run/secrets/kubernetes.io/serviceaccount/token", "the bearer token; empty: none")
	insecure := pflag.Bool("insecure-skip-verify", false, "do not verify the server's certificate (a self-signed one)")
	pflag.Parse()
	fmt.Println(scrape(*url, *tokenFile, *insecure))
}

// scrape returns "status N" (and the body's first line on 200), or
// "error ...".
func scrape(url, tokenFile string, insecure bool) string {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "error " + err.Error()
	}
	if tokenFile != "" {
		token, err := os.ReadFile(tokenFile)
		if err != nil {
			return "error " + err.Error()
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: insecure, MinVersion: tls.VersionTLS12}}}
	resp, err := client.Do(req)
	if err != nil {
		return "error " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	return fmt.Sprintf("status %d %d bytes", resp.StatusCode, len(body))
}
