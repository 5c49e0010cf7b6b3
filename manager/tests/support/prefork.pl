#!/usr/bin/perl
# A pre-fork HTTP/1.1 server for the request sensor's tests (perl-base
# only): the master listens, forks WORKERS children that each accept one
# connection at a time, answer one request and close (Connection: close),
# and exit after PER_CHILD connections; the master forks a new worker for
# each one that exits (Apache's prefork MPM with MaxConnectionsPerChild),
# so workers are forked all through a trace.
# Usage: prefork.pl PORT WORKERS PER_CHILD
use strict;
use warnings;
use IO::Socket::INET;
use POSIX ();

my ($port, $workers, $per_child) = @ARGV;
die "usage: prefork.pl PORT WORKERS PER_CHILD\n" unless $per_child;
my $l = IO::Socket::INET->new(
    LocalAddr => '127.0.0.1', LocalPort => $port, Proto => 'tcp',
    Listen => 1024, ReuseAddr => 1,
) or die "listen 127.0.0.1:$port: $!\n";
$SIG{TERM} = sub { kill 'TERM', keys %main::kids; exit 0 };
our %kids;

sub worker {
    for (1 .. $per_child) {
        my $c = $l->accept or next;
        my $req = '';
        while ($req !~ /\r\n\r\n/) {
            my $n = sysread($c, $req, 4096, length $req);
            last unless $n;
        }
        my $body = "hello from prefork\n";
        syswrite($c, "HTTP/1.1 200 OK\r\nContent-Length: " . length($body)
            . "\r\nConnection: close\r\n\r\n$body");
        close $c;
    }
    POSIX::_exit(0);
}

sub spawn {
    my $pid = fork;
    die "fork: $!\n" unless defined $pid;
    worker() if $pid == 0;
    $kids{$pid} = 1;
}

spawn() for 1 .. $workers;
while (1) {
    my $pid = waitpid(-1, 0);
    last if $pid < 0;
    delete $kids{$pid};
    spawn();
}
