# syntax=docker/dockerfile:1
#
# podres-proxy as a small static image:
#   docker build --build-arg VERSION=v0.1.0 -t podres-proxy:v0.1.0 .
# The binary is the image's entrypoint; deploy/base runs it as
# "/podres-proxy serve ...". deploy/image_test.go builds the binary with
# exactly the go build line below and checks that it is static.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/podres-proxy ./cmd/podres-proxy

# distroless/static: CA certificates, /etc/passwd and nothing else; its
# default user is root (uid 0), which podres-proxy needs for the root-owned
# sockets it connects to (deploy/README.md).
FROM gcr.io/distroless/static-debian13
COPY --from=build /out/podres-proxy /podres-proxy
ENTRYPOINT ["/podres-proxy"]
CMD ["serve"]
