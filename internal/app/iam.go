package app

import (
	"context"
	"fmt"
	"net"
	"strconv"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/rds/auth"
	"github.com/jackc/pgx/v5/pgconn"
)

// tokenSource returns an RDS IAM authentication token for user at
// endpoint (host:port).
type tokenSource func(ctx context.Context, endpoint, user string) (string, error)

// newTokenSource returns the tokenSource of postgres.aws_iam_auth: tokens
// signed for region with the AWS SDK's default credential chain, which it
// loads once (the SDK caches and refreshes the credentials). Tests replace
// it.
var newTokenSource = func(ctx context.Context, region string) (tokenSource, error) {
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(region))
	if err != nil {
		return nil, fmt.Errorf("postgres.aws_iam_auth: load AWS credentials: %w", err)
	}
	return func(ctx context.Context, endpoint, user string) (string, error) {
		return auth.BuildAuthToken(ctx, endpoint, region, user, awsCfg.Credentials)
	}, nil
}

// useIAMAuth makes every connection opened with pc, or with a copy of it
// (the pool's, the capture's dedicated and replication connections), sign
// in with a fresh token from tokens instead of a password. The token is
// made after the network (and TLS) connection is up and before the
// startup message, for pc's first host and port.
func useIAMAuth(pc *pgconn.Config, tokens tokenSource) {
	pc.AfterNetConnect = func(ctx context.Context, c *pgconn.Config, conn net.Conn) (net.Conn, error) {
		tok, err := tokens(ctx, net.JoinHostPort(c.Host, strconv.Itoa(int(c.Port))), c.User)
		if err != nil {
			return nil, fmt.Errorf("postgres.aws_iam_auth: sign a token: %w", err)
		}
		c.Password = tok
		return conn, nil
	}
}
