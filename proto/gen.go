// Package proto holds the gRPC definitions of Retina's services and their
// generated Go code, which is committed. To regenerate after editing a
// .proto file (needs Debian's protobuf-compiler, protoc-gen-go and
// protoc-gen-go-grpc on PATH):
//
//	apt-get install -y protobuf-compiler
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//	go generate ./proto/
package proto

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative txnpb/txn.proto
