"""What the chart draws, and its lifetime: the live sampler or a replay kept apart, the
cluster's lines, and the chart itself.

A chart draws one feed for its whole life; switching feeds makes a new one. The cluster's
lines are only for the chart that shows them: ending the chart ends their feed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..sampler import Sampler
from .contain import FailureLog

if TYPE_CHECKING:
    from ..cluster import Collector
    from ..cluster.feed import ClusterFeed
    from ..sources.replay import ReplaySource

__all__ = ["ChartFeeds", "Replay"]


@dataclass
class Replay:
    """A recording driving the chart, and only the chart: a demonstration of what the chart
    shows on a GPU. The user's own cells stay measured from the live sources."""

    label: str
    source: ReplaySource
    sampler: Sampler


class ChartFeeds:
    """The chart's feeds and the chart (``widget``) of one loaded extension."""

    def __init__(self, sampler: Sampler, interval_s: Callable[[], float],
                 failures: FailureLog) -> None:
        self.sampler = sampler
        self._interval_s = interval_s  # the sampling interval in force (the settings')
        self.failures = failures
        self.replay: Replay | None = None
        self.widget: Any = None  # the chart shown, if any (chart.show makes it)
        self.compact: Any = None  # the compact reading shown, if any (watch --compact)
        # %gpumem cluster / watch --cluster: the collector of the user's client, and the feed
        # polling it for the chart (gpumem_nb.cluster; imported only when asked for).
        self._cluster_collector: Collector | None = None
        self.cluster_feed: ClusterFeed | None = None

    @property
    def feed(self) -> Sampler:
        """What the chart draws: the live sampler, or a replay's own sampler."""
        return self.replay.sampler if self.replay is not None else self.sampler

    # -- a replay ----------------------------------------------------------------------------
    def start_replay(self, name: str) -> Replay:
        """Drive the chart from a recording ("bundled" or a file, ``~`` its owner's home, from
        the magic or GPUMEM_NB_REPLAY); the hooks stay live."""
        from ..sources.replay import ReplaySource

        source = ReplaySource.from_file(None if name == "bundled" else os.path.expanduser(name))
        source.start()
        self.stop_replay()
        sampler = Sampler(source, interval_s=self._interval_s())
        self.replay = Replay(label=source.status().nvml, source=source, sampler=sampler)
        sampler.start()
        self.drop_chart()
        return self.replay

    def stop_replay(self) -> None:
        replay, self.replay = self.replay, None
        if replay is None:
            return
        replay.sampler.stop()
        try:
            replay.source.close()
        except Exception as e:
            self.failures.contain("close", e)
        self.drop_chart()

    # -- the chart ---------------------------------------------------------------------------
    def end_chart(self) -> bool:
        """End the chart and the compact reading, if shown: their outputs become their static
        pictures (with the numbers), and their widgets close. False when there was none."""
        had = self.widget is not None or self.compact is not None
        self.drop_chart()
        self.drop_compact()
        return had

    def drop_compact(self, *, kernel_exiting: bool = False) -> None:
        compact, self.compact = self.compact, None
        if compact is not None:
            try:
                compact.close(kernel_exiting=kernel_exiting)
            except Exception as e:
                self.failures.contain("compact close", e)

    def drop_chart(self, *, kernel_exiting: bool = False) -> None:
        # The cluster's lines were only for that chart: nobody reads them once it is gone.
        self.stop_cluster_feed()
        if self.widget is not None:
            try:
                if kernel_exiting:
                    self.widget.close(kernel_exiting=True)
                else:
                    self.widget.close()
            except Exception as e:
                self.failures.contain("widget close", e)
            self.widget = None

    # -- a cluster beside the kernel ---------------------------------------------------------
    def cluster_collector(self, client: object, factory: Callable[[object], Collector]
                          ) -> Collector:
        """The collector for ``client``, kept while it is the same client (it remembers the
        workers it has seen, so a silent scheduler's rows still have names)."""
        current = self._cluster_collector
        if current is None or getattr(current, "client", None) is not client:
            self.stop_cluster_feed()
            self.close_cluster_collector()
            current = self._cluster_collector = factory(client)
        return current

    def start_cluster_feed(self, collector: Collector) -> ClusterFeed:
        """Poll ``collector`` for the chart's cluster lines (``%gpumem watch --cluster``).
        The feed lives with the chart: ending the chart, or the sampler, ends it too."""
        from ..cluster.feed import ClusterFeed

        feed = self.cluster_feed
        if feed is None or feed.collector is not collector or feed.ended:
            self.stop_cluster_feed()
            feed = self.cluster_feed = ClusterFeed(collector, lambda: self.sampler.interval_s)
        feed.start()
        return feed

    def stop_cluster_feed(self) -> bool:
        """Stop collecting for the chart; False when no feed was running."""
        feed, self.cluster_feed = self.cluster_feed, None
        if feed is None:
            return False
        try:
            running = feed.running
            feed.stop()
            return bool(running)
        except Exception as e:
            self.failures.contain("cluster feed", e)
            return False

    def close_cluster_collector(self) -> None:
        collector, self._cluster_collector = self._cluster_collector, None
        if collector is not None:
            try:
                collector.close()
            except Exception as e:
                self.failures.contain("cluster collector", e)

    def close(self) -> None:
        """Unload: the cluster's feed and collector, the replay and the chart end."""
        self.stop_cluster_feed()
        self.close_cluster_collector()
        self.drop_compact()
        self.stop_replay()
