#!/bin/sh
# kafka-storage.sh of the segscope Kafka image: the jars' StorageTool (format the KRaft log dir)
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} -XX:TieredStopAtLevel=1 \
    -Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties \
    -cp '/opt/kafka/libs/*' kafka.tools.StorageTool "$@"
